#!/usr/bin/env python3
"""Checks that the Paho Python client (what Home Assistant uses) works against a
Sagüin broker on 127.0.0.1, in MQTT 3.1.1 and MQTT 5, the way Home Assistant uses it.

    python3 tests/interop/paho_check.py --port N

Works with paho-mqtt 1.6 (Debian 12) and 2.x (it detects CallbackAPIVersion and
uses VERSION2 callbacks). Prints one line per check passed; on the first failure it
prints what failed and exits 1. Every wait is bounded by a timeout of a few seconds.
Run by `paho_python_client_works_as_home_assistant_uses_it` in tests/interop_clients.rs.
"""

import argparse
import json
import os
import queue
import socket
import sys
import threading
import time

import paho.mqtt
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

HOST = "127.0.0.1"
WAIT = 5.0  # seconds any one expected event may take
QUIET = 1.0  # seconds to watch for something that must not arrive
VERSION2 = hasattr(mqtt, "CallbackAPIVersion")


class CheckFailed(Exception):
    pass


def check(condition, what):
    if not condition:
        raise CheckFailed(what)


def value(code):
    """An int from a reason code: paho 1.6 gives ints or ReasonCodes, 2.x ReasonCode."""
    return getattr(code, "value", code)


class Client:
    """One paho client on its own network thread, with every callback turned into a
    queue or an event the checks wait on with a timeout."""

    def __init__(self, run, name, clean=True):
        self.run = run
        self.v5 = run.v5
        self.client_id = f"{run.prefix}-{name}"
        kwargs = {
            "client_id": self.client_id,
            "protocol": mqtt.MQTTv5 if self.v5 else mqtt.MQTTv311,
        }
        if not self.v5:
            kwargs["clean_session"] = clean
        self.clean = clean
        if VERSION2:
            self.mqtt = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kwargs)
        else:
            self.mqtt = mqtt.Client(**kwargs)
        self.messages = queue.Queue()
        self.connack = queue.Queue()
        self.acks = {}
        self.acked = threading.Condition()
        self.mqtt.on_connect = self._on_connect
        self.mqtt.on_message = self._on_message
        self.mqtt.on_subscribe = self._on_subscribe
        self.mqtt.on_unsubscribe = self._on_unsubscribe
        run.clients.append(self)

    # Callbacks: paho 1.6 passes (client, userdata, flags, rc[, properties]) and so on,
    # 2.x with VERSION2 always passes properties; *args covers both.
    def _on_connect(self, _client, _userdata, flags, rc, *_rest):
        if isinstance(flags, dict):
            present = bool(flags.get("session present"))
        else:
            present = bool(flags.session_present)
        self.connack.put((value(rc), present))

    def _on_message(self, _client, _userdata, msg):
        self.messages.put(msg)

    def _ack(self, mid, codes):
        with self.acked:
            self.acks[mid] = codes
            self.acked.notify_all()

    def _on_subscribe(self, _client, _userdata, mid, codes, *_rest):
        self._ack(mid, [value(c) for c in codes])

    def _on_unsubscribe(self, _client, _userdata, mid, *rest):
        # 1.6 MQTT 5: (properties, reason codes); 2.x: (reason codes, properties).
        self._ack(mid, rest)

    def wait_ack(self, mid, what):
        deadline = time.monotonic() + WAIT
        with self.acked:
            while mid not in self.acks:
                left = deadline - time.monotonic()
                check(left > 0, f"{self.client_id}: no {what} within {WAIT}s")
                self.acked.wait(left)
            return self.acks.pop(mid)

    def will(self, topic, payload, qos=1, retain=True):
        self.mqtt.will_set(topic, payload, qos=qos, retain=retain)

    def connect(self, clean=True, session_expiry=None):
        kwargs = {}
        if self.v5:
            kwargs["clean_start"] = clean
            if session_expiry is not None:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = session_expiry
                kwargs["properties"] = props
        self.mqtt.connect(HOST, self.run.port, keepalive=30, **kwargs)
        self.mqtt.loop_start()
        try:
            rc, present = self.connack.get(timeout=WAIT)
        except queue.Empty:
            raise CheckFailed(f"{self.client_id}: no CONNACK within {WAIT}s")
        check(rc == 0, f"{self.client_id}: CONNACK refused with reason {rc}")
        return present

    def subscribe(self, topic, qos, no_local=False):
        if self.v5:
            options = SubscribeOptions(qos=qos, noLocal=no_local)
            rc, mid = self.mqtt.subscribe(topic, options=options)
        else:
            rc, mid = self.mqtt.subscribe(topic, qos)
        check(rc == mqtt.MQTT_ERR_SUCCESS, f"{self.client_id}: subscribe {topic}: {rc}")
        codes = self.wait_ack(mid, f"SUBACK for {topic}")
        check(
            codes == [qos],
            f"{self.client_id}: SUBACK for {topic} at QoS {qos} granted {codes}",
        )

    def unsubscribe(self, topic):
        rc, mid = self.mqtt.unsubscribe(topic)
        check(rc == mqtt.MQTT_ERR_SUCCESS, f"{self.client_id}: unsubscribe {topic}: {rc}")
        self.wait_ack(mid, f"UNSUBACK for {topic}")

    def publish(self, topic, payload, qos=0, retain=False, properties=None):
        info = self.mqtt.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        check(info.rc == mqtt.MQTT_ERR_SUCCESS, f"{self.client_id}: publish {topic}: {info.rc}")
        info.wait_for_publish(WAIT)
        check(
            info.is_published(),
            f"{self.client_id}: QoS {qos} publish to {topic} not acknowledged within {WAIT}s",
        )

    def expect(self, what, timeout=WAIT):
        """The next message; fails naming `what` if none comes in time."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise CheckFailed(f"{self.client_id}: {what}: nothing arrived within {timeout}s")

    def expect_n(self, n, what):
        deadline = time.monotonic() + WAIT
        got = []
        while len(got) < n:
            left = deadline - time.monotonic()
            try:
                got.append(self.messages.get(timeout=max(left, 0.01)))
            except queue.Empty:
                raise CheckFailed(
                    f"{self.client_id}: {what}: {len(got)} of {n} messages within {WAIT}s: "
                    + ", ".join(describe(m) for m in got)
                )
        return got

    def expect_nothing(self, what, timeout=QUIET):
        try:
            msg = self.messages.get(timeout=timeout)
        except queue.Empty:
            return
        raise CheckFailed(f"{self.client_id}: {what}: but got {describe(msg)}")

    def disconnect(self):
        """A clean DISCONNECT, then the network thread stops."""
        self.mqtt.disconnect()
        self.mqtt.loop_stop()

    def drop(self):
        """Ends the connection without DISCONNECT: stop the network thread, then shut
        the socket down under paho (the same on 1.6 and 2.x)."""
        self.mqtt.loop_stop()
        sock = self.mqtt.socket()
        check(sock is not None, f"{self.client_id}: no socket to drop")
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


def describe(msg):
    return f"{msg.topic} {msg.payload!r} qos={msg.qos} retain={int(msg.retain)}"


class Run:
    def __init__(self, port, v5):
        self.port = port
        self.v5 = v5
        self.label = "MQTT 5" if v5 else "MQTT 3.1.1"
        # Topics and client ids unique to this run, so the two protocol runs (and
        # leftovers of an earlier run on a reused broker) never meet.
        self.prefix = f"paho{'5' if v5 else '3'}-{os.getpid()}"
        self.clients = []

    def passed(self, what):
        print(f"ok [{self.label}] {what}", flush=True)

    def close(self):
        for c in self.clients:
            try:
                c.mqtt.loop_stop()
                c.mqtt.disconnect()
            except Exception:
                pass


def discovery_and_availability(run):
    """Home Assistant's MQTT discovery: a device with a retained Will on its
    availability topic publishes a retained birth message and retained discovery
    configs under homeassistant/; HA subscribes with a wildcard."""
    node = run.prefix
    avail = f"{node}/availability"
    configs = {
        f"homeassistant/sensor/{node}/temperature/config": json.dumps(
            {"name": "Temperature", "state_topic": f"{node}/temperature",
             "availability_topic": avail, "unit_of_measurement": "°C"}
        ).encode(),
        f"homeassistant/binary_sensor/{node}/door/config": json.dumps(
            {"name": "Door", "state_topic": f"{node}/door", "availability_topic": avail}
        ).encode(),
    }

    def expect_device(sub, what, retained):
        """The birth message and every config, at QoS 1, with the retain flag as given
        (0 on a live delivery to a current subscriber, 1 on a retained value sent at
        subscribe time)."""
        got = {m.topic: m for m in sub.expect_n(1 + len(configs), what)}
        check(set(got) == {avail, *configs}, f"{what} on {sorted(got)}")
        for topic, payload in [(avail, b"online"), *configs.items()]:
            m = got[topic]
            check(m.payload == payload, f"{what}: {describe(m)}")
            check(m.retain == retained, f"{what}: retain flag {int(m.retain)}: {describe(m)}")
            check(m.qos == 1, f"{what}: QoS {m.qos}, not 1: {describe(m)}")

    ha = Client(run, "ha")
    ha.connect()
    ha.subscribe(f"homeassistant/+/{node}/#", 1)
    ha.subscribe(avail, 1)

    device = Client(run, "device")
    device.will(avail, b"offline", qos=1, retain=True)
    device.connect()
    device.publish(avail, b"online", qos=1, retain=True)
    for topic, payload in configs.items():
        device.publish(topic, payload, qos=1, retain=True)
    expect_device(ha, "live birth and discovery messages", retained=False)
    run.passed("Will set, retained birth and discovery configs delivered live (retain flag 0)")

    later = Client(run, "ha-later")
    later.connect()
    later.subscribe(f"homeassistant/+/{node}/#", 1)
    later.subscribe(f"{node}/#", 1)
    expect_device(later, "retained values for a later subscriber", retained=True)
    later.expect_nothing("nothing more than the retained values")
    run.passed("a later wildcard subscriber gets every retained value flagged retained")

    # A zero-length retained publish clears the value (how HA removes an entity).
    gone, kept = list(configs)
    device.publish(gone, b"", qos=1, retain=True)
    m = ha.expect("the zero-length publish delivered live")
    check(m.topic == gone and m.payload == b"", f"live clear {describe(m)}")
    m = later.expect("the zero-length publish delivered live")
    check(m.topic == gone and m.payload == b"", f"live clear {describe(m)}")
    third = Client(run, "ha-third")
    third.connect()
    third.subscribe(f"homeassistant/+/{node}/#", 1)
    m = third.expect("the remaining retained config")
    check(m.topic == kept and m.retain, f"retained after the clear {describe(m)}")
    third.expect_nothing(f"the cleared retained value of {gone} must not be sent")
    third.disconnect()
    run.passed("a zero-length retained publish clears the retained value")

    # The device drops off the network: the broker publishes its Will.
    device.drop()
    m = ha.expect("the Will after a connection closed without DISCONNECT")
    check(m.topic == avail and m.payload == b"offline", f"Will {describe(m)}")
    check(m.qos == 1, f"Will delivered at QoS {m.qos}, not 1")
    m = later.expect("the Will after a connection closed without DISCONNECT")
    check(m.topic == avail and m.payload == b"offline", f"Will {describe(m)}")
    fourth = Client(run, "ha-fourth")
    fourth.connect()
    fourth.subscribe(avail, 1)
    m = fourth.expect("the retained Will")
    check(m.payload == b"offline" and m.retain, f"the Will is not retained: {describe(m)}")
    fourth.disconnect()
    run.passed("a connection closed without DISCONNECT publishes the retained Will")

    # A clean DISCONNECT discards the Will.
    avail2 = f"{node}/availability2"
    ha.subscribe(avail2, 1)
    polite = Client(run, "device2")
    polite.will(avail2, b"offline", qos=1, retain=True)
    polite.connect()
    polite.publish(avail2, b"online", qos=1, retain=True)
    m = ha.expect("the second device's birth")
    check(m.topic == avail2 and m.payload == b"online", f"birth {describe(m)}")
    polite.disconnect()
    ha.expect_nothing("a clean DISCONNECT must not publish the Will", timeout=2 * QUIET)
    run.passed("a clean DISCONNECT does not publish the Will")

    later.disconnect()
    ha.disconnect()


def qos_order_and_unsubscribe(run):
    topic = f"{run.prefix}/qos/t"
    marker = f"{run.prefix}/marker"
    sub2 = Client(run, "sub-qos2")
    sub2.connect()
    sub2.subscribe(f"{run.prefix}/qos/#", 2)
    sub1 = Client(run, "sub-qos1")
    sub1.connect()
    sub1.subscribe(topic, 1)
    sub0 = Client(run, "sub-qos0")
    sub0.connect()
    sub0.subscribe(topic, 0)

    pub = Client(run, "pub-qos")
    pub.connect()
    sent = []
    for i in range(4):
        for qos in (0, 1, 2):
            payload = f"m{i}-q{qos}".encode()
            pub.publish(topic, payload, qos=qos)
            sent.append((payload, qos))
    for sub, granted in ((sub2, 2), (sub1, 1), (sub0, 0)):
        got = sub.expect_n(len(sent), f"publishes at QoS 0, 1, 2 to a QoS {granted} subscriber")
        sent_qos = {p: q for p, q in sent}
        for m in got:
            qos = sent_qos.get(m.payload)
            check(qos is not None, f"QoS {granted} subscriber got a stranger: {describe(m)}")
            check(
                m.qos == min(qos, granted),
                f"QoS {qos} publish reached a QoS {granted} subscription at QoS {m.qos}: {describe(m)}",
            )
            check(not m.retain, f"a non-retained publish arrives flagged retained: {describe(m)}")
        # Paho hands an incoming QoS 2 message to on_message only at its PUBREL, a
        # round trip after the PUBLISH, so a QoS 0 or 1 message the broker sent after
        # it may reach on_message first: across QoS levels the order is only checked
        # where the subscription keeps every delivery below QoS 2. At each QoS level
        # it is always checked (MQTT-4.6.0-6).
        if granted < 2:
            order = [p for p, _ in sent]
        else:
            order = sorted((p for p, _ in sent), key=lambda p: sent_qos[p])
            got = sorted(got, key=lambda m: sent_qos[m.payload])
        check(
            [m.payload for m in got] == order,
            f"QoS {granted} subscriber got them out of order: {[m.payload for m in got]}",
        )
    run.passed("QoS 0, 1 and 2 publishes delivered in order at min(publish, granted) QoS")

    sub2.unsubscribe(f"{run.prefix}/qos/#")
    sub2.subscribe(marker, 1)
    pub.publish(topic, b"after-unsubscribe", qos=1)
    pub.publish(marker, b"marker", qos=1)
    m = sub2.expect("the marker after unsubscribing")
    check(m.topic == marker, f"after UNSUBSCRIBE the unsubscribed filter still delivers {describe(m)}")
    sub2.expect_nothing("nothing after UNSUBSCRIBE")
    m = sub1.expect("the publish to a still-subscribed client")
    check(m.payload == b"after-unsubscribe", f"still subscribed {describe(m)}")
    run.passed("UNSUBSCRIBE stops delivery")
    for c in (sub2, sub1, sub0, pub):
        c.disconnect()


def persistent_session(run):
    topic = f"{run.prefix}/session"
    if run.v5:
        sub = Client(run, "sess")
        sub.connect(clean=True, session_expiry=300)
    else:
        # Start from nothing: a clean session first, then the persistent one.
        fresh = Client(run, "sess", clean=True)
        fresh.connect()
        fresh.disconnect()
        sub = Client(run, "sess", clean=False)
        sub.connect(clean=False)
    sub.subscribe(topic, 1)
    sub.disconnect()

    pub = Client(run, "sess-pub")
    pub.connect()
    if run.v5:
        props = Properties(PacketTypes.PUBLISH)
        props.MessageExpiryInterval = 1
        pub.publish(topic, b"expires", qos=1, properties=props)
    for i in range(3):
        pub.publish(topic, f"while-away-{i}".encode(), qos=1)
    pub.disconnect()
    if run.v5:
        time.sleep(2.2)  # past the first message's expiry

    back = Client(run, "sess", clean=False)
    if run.v5:
        present = back.connect(clean=False, session_expiry=300)
    else:
        present = back.connect(clean=False)
    check(present, "reconnecting to a stored session: CONNACK session present is 0")
    got = back.expect_n(3, "QoS 1 messages published while the session was away")
    check(
        [m.payload for m in got] == [f"while-away-{i}".encode() for i in range(3)],
        f"messages queued for the session: {[describe(m) for m in got]}",
    )
    check(all(m.qos == 1 for m in got), f"queued QoS: {[describe(m) for m in got]}")
    back.expect_nothing("nothing more queued (an expired message must not be sent)")
    what = "Session Expiry Interval 300" if run.v5 else "clean session 0"
    extra = "; a message whose Message Expiry passed is dropped" if run.v5 else ""
    run.passed(f"a session with {what} resumes (session present) with QoS 1 messages sent while away{extra}")
    # End the stored session: a clean start with no expiry.
    back.disconnect()
    cleanup = Client(run, "sess", clean=True)
    cleanup.connect(clean=True)
    cleanup.disconnect()


def v5_properties(run):
    topic = f"{run.prefix}/request"
    sub = Client(run, "props-sub")
    sub.connect()
    sub.subscribe(topic, 1)
    pub = Client(run, "props-pub")
    pub.connect()
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("source", "paho"), ("source", "again"), ("ünïcode", "värde")]
    props.ResponseTopic = f"{run.prefix}/reply"
    props.CorrelationData = b"\x00corr\xff"
    props.ContentType = "application/json"
    props.MessageExpiryInterval = 120
    pub.publish(topic, b'{"on": true}', qos=1, properties=props)
    m = sub.expect("a publish with MQTT 5 properties")
    got = m.properties
    check(got is not None, f"no properties on {describe(m)}")
    user = [tuple(p) for p in getattr(got, "UserProperty", [])]
    check(user == props.UserProperty, f"User Properties {user}, sent {props.UserProperty}")
    check(getattr(got, "ResponseTopic", None) == props.ResponseTopic,
          f"Response Topic {getattr(got, 'ResponseTopic', None)!r}")
    check(getattr(got, "CorrelationData", None) == props.CorrelationData,
          f"Correlation Data {getattr(got, 'CorrelationData', None)!r}")
    check(getattr(got, "ContentType", None) == props.ContentType,
          f"Content Type {getattr(got, 'ContentType', None)!r}")
    expiry = getattr(got, "MessageExpiryInterval", None)
    check(expiry is not None and 0 < expiry <= 120, f"Message Expiry Interval {expiry!r}, sent 120")
    check(m.payload == b'{"on": true}', f"payload {describe(m)}")
    run.passed("User Properties, Response Topic, Correlation Data, Content Type and "
               "Message Expiry Interval travel end to end")

    # No Local: a client does not get back what it publishes itself.
    shared = f"{run.prefix}/nolocal"
    marker = f"{run.prefix}/nolocal-marker"
    me = Client(run, "nolocal")
    me.connect()
    me.subscribe(shared, 1, no_local=True)
    me.subscribe(marker, 1)
    other = Client(run, "nolocal-other")
    other.connect()
    other.subscribe(shared, 1)
    me.publish(shared, b"mine", qos=1)
    me.publish(marker, b"marker", qos=1)
    m = other.expect("another client's publish under No Local")
    check(m.payload == b"mine", f"other subscriber {describe(m)}")
    m = me.expect("the marker (subscribed without No Local)")
    check(m.topic == marker, f"No Local subscription delivered the client's own publish: {describe(m)}")
    me.expect_nothing("No Local: nothing of its own")
    other.publish(shared, b"theirs", qos=1)
    m = me.expect("another client's publish on a No Local subscription")
    check(m.payload == b"theirs", f"No Local subscriber {describe(m)}")
    run.passed("No Local: the client's own publish is not sent back, others' are")
    for c in (sub, pub, me, other):
        c.disconnect()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    print(f"paho-mqtt {getattr(paho.mqtt, '__version__', '?')}, "
          f"callbacks {'VERSION2' if VERSION2 else '1.x'}", flush=True)
    for v5 in (False, True):
        run = Run(args.port, v5)
        try:
            discovery_and_availability(run)
            qos_order_and_unsubscribe(run)
            persistent_session(run)
            if v5:
                v5_properties(run)
        except CheckFailed as failed:
            print(f"FAILED [{run.label}] {failed}", flush=True)
            run.close()
            return 1
        run.close()
    print("all Paho checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
