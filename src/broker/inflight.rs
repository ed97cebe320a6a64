//! A session's outbound exchanges on the wire: found by packet identifier,
//! remembered in the order they were sent, and the bytes of those still published
//! summed as they come and go.
//!
//! The order is what a resumed session gets them again in: what one publisher sent
//! to one topic reaches a subscriber in that order, what is sent again included
//! (MQTT-4.6.0-5). Packet identifiers do not tell it. They wrap past 65,535, and after
//! a graceful stop a record goes again under the identifier it had, above the free
//! ones new deliveries take.
//!
//! The sum is what a full window asks on every delivery (`Session::window_open`):
//! summed by walking the table, a replay of a channel spent half its time there.

use std::collections::VecDeque;
use std::collections::hash_map::Entry;

use super::Map;
use super::channels::ChannelId;
use super::session::{Delivery, Inflight, KeptRecord, Untracked};
use crate::codec::QoS;

/// A client's answer to an outbound exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// PUBACK.
    PubAck,
    /// PUBREC.
    PubRec,
    /// PUBCOMP.
    PubComp,
}

impl Inflight {
    /// Whether `answer` may answer this exchange: a PUBACK a QoS 1 PUBLISH, a PUBREC
    /// a QoS 2 one (again once it is released), a PUBCOMP a PUBREL. Any other is a
    /// Protocol Error (MQTT 5 sections 4.3.2, 4.3.3).
    pub fn takes(&self, answer: Answer) -> bool {
        match (self, answer) {
            (Inflight::Published(d), Answer::PubAck) => d.qos == QoS::AtLeastOnce,
            (Inflight::Published(d), Answer::PubRec) => d.qos == QoS::ExactlyOnce,
            (Inflight::Released(..), Answer::PubRec | Answer::PubComp) => true,
            (Inflight::Published(_), Answer::PubComp)
            | (Inflight::Released(..), Answer::PubAck) => false,
        }
    }
}

/// Below this many slots the table keeps its room when it empties; above, it gives
/// back what a burst left (a window can reach a client's Receive Maximum).
const KEEP_SLOTS: usize = 64;

/// Outbound exchanges by packet identifier, each with its place in the order sent.
/// Only this module changes an exchange, so `published_bytes` is always their sum.
#[derive(Debug, Default)]
pub struct InflightTable {
    by_id: Map<u16, (u64, Inflight)>,
    /// The place the next exchange takes.
    next_place: u64,
    /// What the exchanges still published are charged (`Message::charge`).
    published_bytes: usize,
    /// A resumed session's exchanges not yet sent again on its new connection, by
    /// place and identifier, oldest first (`mark_unsent`). One whose place no
    /// longer matches went meanwhile; the places of the rest run from the front's
    /// to the back's, and no later exchange takes one of them.
    unsent: VecDeque<(u64, u16)>,
    /// How many of `unsent` are still in the table.
    unsent_left: usize,
}

/// What `inflight` is charged while on the wire: a PUBLISH its message, a PUBREL
/// nothing.
fn charge(inflight: &Inflight) -> usize {
    match inflight {
        Inflight::Published(d) => d.charge(),
        Inflight::Released(..) => 0,
    }
}

impl InflightTable {
    /// How many exchanges are on the wire.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Whether `id` is taken by one.
    pub fn contains_key(&self, id: &u16) -> bool {
        self.by_id.contains_key(id)
    }

    /// The exchange under `id`.
    pub fn get(&self, id: &u16) -> Option<&Inflight> {
        self.by_id.get(id).map(|(_, inflight)| inflight)
    }

    /// Whether `answer` is one the exchange under `id` may get ([`Inflight::takes`]).
    /// An identifier with no exchange is a late answer to one that went, which fits.
    pub fn fits(&self, id: u16, answer: Answer) -> bool {
        self.get(&id).is_none_or(|inflight| inflight.takes(answer))
    }

    /// What the exchanges still published are charged, summed.
    pub fn published_bytes(&self) -> usize {
        self.published_bytes
    }

    /// Puts `inflight` under `id`: last in the order, or in the place of the exchange
    /// it replaces.
    pub fn insert(&mut self, id: u16, inflight: Inflight) {
        self.published_bytes += charge(&inflight);
        match self.by_id.entry(id) {
            Entry::Occupied(mut taken) => {
                let old = std::mem::replace(&mut taken.get_mut().1, inflight);
                self.published_bytes -= charge(&old);
            }
            Entry::Vacant(free) => {
                free.insert((self.next_place, inflight));
                self.next_place += 1;
            }
        }
    }

    /// Moves the QoS 2 exchange `id` from PUBLISH to PUBREL in its place, its row in
    /// storage named by `stored`: `None` when there is no exchange `id`, else
    /// the delivery it published (`None` when it was released already).
    pub fn release(&mut self, id: u16, stored: Option<u64>) -> Option<Option<Delivery>> {
        let (_, slot) = self.by_id.get_mut(&id)?;
        let record = match slot {
            Inflight::Published(d) => d.record,
            Inflight::Released(..) => return Some(None),
        };
        let Inflight::Published(d) = std::mem::replace(slot, Inflight::Released(record, stored))
        else {
            return Some(None);
        };
        self.published_bytes -= d.charge();
        Some(Some(d))
    }

    /// Takes the exchange under `id` out.
    pub fn remove(&mut self, id: &u16) -> Option<Inflight> {
        let (place, inflight) = self.by_id.remove(id)?;
        self.published_bytes -= charge(&inflight);
        self.forget_unsent(place);
        self.give_back_room();
        Some(inflight)
    }

    /// Keeps only the exchanges `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&u16, &Inflight) -> bool) {
        let mut gone = 0;
        let mut places = Vec::new();
        let unsent = self.unsent_left > 0;
        self.by_id.retain(|id, (place, inflight)| {
            let kept = keep(id, inflight);
            if !kept {
                gone += charge(inflight);
                if unsent {
                    places.push(*place);
                }
            }
            kept
        });
        self.published_bytes -= gone;
        for place in places {
            self.forget_unsent(place);
        }
        self.give_back_room();
    }

    /// Forgets every exchange.
    pub fn clear(&mut self) {
        self.by_id = Map::default();
        self.published_bytes = 0;
        self.unsent = VecDeque::new();
        self.unsent_left = 0;
    }

    /// Marks every exchange as not yet sent on the connection that resumes the
    /// session: they go again, oldest first, as the client's Receive Maximum has
    /// room (`take_unsent`, MQTT-3.3.4-9).
    pub fn mark_unsent(&mut self) {
        let mut all: Vec<(u64, u16)> = (self.by_id.iter())
            .map(|(id, (place, _))| (*place, *id))
            .collect();
        all.sort_unstable();
        self.unsent_left = all.len();
        self.unsent = all.into();
    }

    /// The oldest exchange not yet sent again, now counted as on the wire.
    pub fn take_unsent(&mut self) -> Option<u16> {
        while let Some((place, id)) = self.unsent.pop_front() {
            if self.by_id.get(&id).is_some_and(|(p, _)| *p == place) {
                self.unsent_left = self.unsent_left.saturating_sub(1);
                if self.unsent.is_empty() {
                    self.unsent = VecDeque::new();
                }
                return Some(id);
            }
        }
        self.unsent = VecDeque::new();
        None
    }

    /// How many exchanges are on the wire: those not waiting to be sent again.
    pub fn on_wire(&self) -> usize {
        self.by_id.len() - self.unsent_left
    }

    /// Whether any exchange waits to be sent again.
    pub fn has_unsent(&self) -> bool {
        self.unsent_left > 0
    }

    /// An exchange at `place` went: if it was waiting to be sent again, one fewer is.
    fn forget_unsent(&mut self, place: u64) {
        let waiting = match (self.unsent.front(), self.unsent.back()) {
            (Some((first, _)), Some((last, _))) => (*first..=*last).contains(&place),
            _ => false,
        };
        if waiting {
            self.unsent_left = self.unsent_left.saturating_sub(1);
        }
    }

    /// Every exchange, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &Inflight> {
        self.by_id.values().map(|(_, inflight)| inflight)
    }

    /// Detaches what is on the wire from `channel`'s cursor, which a seek moved: each
    /// becomes a copy no cursor tracks, so its acknowledgement settles nothing, and
    /// the same offset read again from the new position is not settled by it (G-18).
    pub fn detach_channel(&mut self, channel: ChannelId) {
        for (_, inflight) in self.by_id.values_mut() {
            match inflight {
                Inflight::Published(d) if d.origin().is_some_and(|(c, _)| c == channel) => {
                    d.record = None;
                    d.untracked = Untracked::Kept;
                }
                Inflight::Released(record, _)
                    if record.is_some_and(|(c, _)| c == Some(channel)) =>
                {
                    *record = None;
                }
                _ => {}
            }
        }
    }

    /// The record each released exchange holds, to forget one that is settled.
    pub fn released_records_mut(&mut self) -> impl Iterator<Item = &mut Option<KeptRecord>> {
        self.by_id
            .values_mut()
            .filter_map(|(_, inflight)| match inflight {
                Inflight::Released(record, _) => Some(record),
                Inflight::Published(_) => None,
            })
    }

    /// Every exchange with its identifier, oldest first.
    pub fn in_send_order(&self) -> Vec<(u16, &Inflight)> {
        let mut all: Vec<(u64, u16, &Inflight)> = self
            .by_id
            .iter()
            .map(|(id, (place, inflight))| (*place, *id, inflight))
            .collect();
        all.sort_unstable_by_key(|(place, ..)| *place);
        all.into_iter()
            .map(|(_, id, inflight)| (id, inflight))
            .collect()
    }

    /// Frees what a burst left once three quarters of it stand empty.
    fn give_back_room(&mut self) {
        let capacity = self.by_id.capacity();
        if capacity > KEEP_SLOTS && self.by_id.len() * 4 < capacity {
            self.by_id.shrink_to(KEEP_SLOTS.max(self.by_id.len() * 2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(offset: u64) -> Inflight {
        Inflight::Released(Some((None, offset)), None)
    }

    fn offsets(table: &InflightTable) -> Vec<(u16, u64)> {
        table
            .in_send_order()
            .into_iter()
            .map(|(id, inflight)| match inflight {
                Inflight::Released(Some((None, offset)), _) => (id, *offset),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_order_sent_survives_identifiers_that_wrap_and_exchanges_that_move_on() {
        let mut table = InflightTable::default();
        for (id, offset) in [(65_534, 1), (65_535, 2), (1, 3), (2, 4)] {
            table.insert(id, released(offset));
        }
        table.insert(65_535, released(20));
        assert_eq!(offsets(&table), [(65_534, 1), (65_535, 20), (1, 3), (2, 4)]);
        assert!(table.remove(&65_534).is_some());
        table.insert(65_534, released(5));
        assert_eq!(offsets(&table), [(65_535, 20), (1, 3), (2, 4), (65_534, 5)]);
        table.retain(|id, _| *id != 1);
        assert_eq!(offsets(&table), [(65_535, 20), (2, 4), (65_534, 5)]);
    }

    /// MQTT-3.3.4-9: what a resume has to send again goes oldest first; one that
    /// went meanwhile (settled, or its identifier taken again) is neither sent nor
    /// counted, and what was sent counts as on the wire.
    #[test]
    fn exchanges_to_send_again_go_oldest_first_and_count_once_sent() {
        let mut table = InflightTable::default();
        for (id, offset) in [(65_535, 1), (1, 2), (2, 3), (3, 4)] {
            table.insert(id, released(offset));
        }
        table.mark_unsent();
        assert_eq!((table.on_wire(), table.has_unsent()), (0, true));
        assert_eq!(table.take_unsent(), Some(65_535));
        assert_eq!(table.on_wire(), 1);
        assert!(
            table.remove(&1).is_some(),
            "settled before it was sent again"
        );
        table.insert(1, released(9)); // a new exchange under its identifier
        assert_eq!(table.on_wire(), 2, "the new one is on the wire");
        table.retain(|id, _| *id != 2);
        assert_eq!(table.take_unsent(), Some(3));
        assert_eq!((table.take_unsent(), table.has_unsent()), (None, false));
        assert_eq!(table.on_wire(), 3);
    }

    /// G-18: a seek detaches what is on the wire from the channel it moved, and
    /// nothing else: a late acknowledgement of it then settles no offset.
    #[test]
    fn a_seek_detaches_the_channels_exchanges_alone() {
        let mut table = InflightTable::default();
        table.insert(1, Inflight::Released(Some((Some(3), 95)), None));
        table.insert(2, Inflight::Released(Some((Some(4), 95)), None));
        table.insert(3, released(7));
        table.detach_channel(3);
        let records: Vec<_> = table
            .in_send_order()
            .into_iter()
            .map(|(id, inflight)| match inflight {
                Inflight::Released(record, _) => (id, *record),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            records,
            [(1, None), (2, Some((Some(4), 95))), (3, Some((None, 7)))]
        );
    }

    #[test]
    fn a_burst_gives_its_room_back_as_it_drains() {
        let mut table = InflightTable::default();
        for id in 1..=10_000 {
            table.insert(id, released(u64::from(id)));
        }
        let burst = table.by_id.capacity();
        for id in 1..=9_990 {
            assert!(table.remove(&id).is_some());
        }
        assert!(
            table.by_id.capacity() <= burst / 100,
            "{}",
            table.by_id.capacity()
        );
        assert_eq!(table.len(), 10);
        assert_eq!(table.in_send_order()[0].0, 9_991);
    }
}
