//! `/v1/operations/…`: what the broker holds, as JSON, for an operator (gaps §4).
//!
//! - `/v1/operations/subscriptions?client=ID`: a session's subscriptions, each with
//!   its options and its one partition space (C-197): the count and the indices it
//!   declared with `saguin-filter`, or count 1, index 0 for a subscription that
//!   declared none.
//! - `/v1/operations/acl?user=NAME[&client=ID]`: what `saguin --acl FILE NAME [ID]
//!   --json` answers, from the acl_file the broker holds now, SIGUSR1 re-reads
//!   included (B-320).
//! - `/v1/operations/users`: every client's session, by client id, with the name
//!   its door proved and the door it came through, by the name B-175 gives it.
//!   The broker's own sessions (a bridge's out rules) are no client's and are left
//!   out. As long as the sessions the broker holds, which its limits bound.
//!
//! Each answer is one borrow of the broker's state, with no await inside it.

use serde_json::{Value, json};

use crate::broker::session::{Session, Subscription};
use crate::server::Shared;

/// An answer: its status and its JSON body.
pub type Answer = (u16, String);

/// `/v1/operations/subscriptions?client=ID`.
pub fn subscriptions(shared: &Shared, query: &str) -> Answer {
    let Some(client) = query_value(query, "client") else {
        return refused(
            400,
            "name the session: /v1/operations/subscriptions?client=ID",
        );
    };
    let broker = shared.broker.borrow();
    let Some(session) = broker.held_session(&client) else {
        return refused(404, &format!("no session is held for client id {client:?}"));
    };
    let mut subscriptions: Vec<&Subscription> = session.subscriptions.values().collect();
    subscriptions.sort_by(|a, b| (&a.share, &a.filter).cmp(&(&b.share, &b.filter)));
    let body = json!({
        "client": client,
        "connected": session.link.is_some(),
        "subscriptions": subscriptions.into_iter().map(subscription).collect::<Vec<Value>>(),
    });
    (200, format!("{body}\n"))
}

/// `/v1/operations/users`.
pub fn users(shared: &Shared) -> Answer {
    let broker = shared.broker.borrow();
    let mut sessions: Vec<&Session> = broker.held_sessions().filter(|s| !s.internal).collect();
    sessions.sort_by(|a, b| a.client_id.cmp(&b.client_id));
    let sessions: Vec<Value> = sessions
        .into_iter()
        .map(|s| {
            json!({
                "client": &*s.client_id,
                "user": s.user.as_deref(),
                "listener": s.listener.as_deref(),
                "connected": s.link.is_some(),
                "session_expiry": s.expiry,
                "subscriptions": s.subscriptions.len(),
            })
        })
        .collect();
    (200, format!("{}\n", json!({ "sessions": sessions })))
}

fn subscription(sub: &Subscription) -> Value {
    let (count, indices) = match &sub.slice {
        Some(slice) => (slice.partitions(), slice.indices().to_vec()),
        None => (1, vec![0]),
    };
    json!({
        "filter": sub.filter,
        "share": sub.share,
        "qos": sub.options.qos as u8,
        "no_local": sub.options.no_local,
        "retain_as_published": sub.options.retain_as_published,
        "retain_handling": sub.options.retain_handling as u8,
        "identifier": sub.identifier,
        "partitions": { "count": count, "indices": indices },
    })
}

/// `/v1/operations/acl?user=NAME[&client=ID]`.
pub fn acl(shared: &Shared, query: &str) -> Answer {
    let Some(acl) = &shared.acl else {
        return refused(
            404,
            "no acl_file is configured: every client may do what its door admits",
        );
    };
    let Some(user) = query_value(query, "user") else {
        return refused(
            400,
            "name the user: /v1/operations/acl?user=NAME, with &client=ID to decide client_ids: and %c",
        );
    };
    let client = query_value(query, "client");
    let policy = acl.policy();
    let body = crate::acl::explain::explain_one_json(&policy, &user, client.as_deref());
    (200, body)
}

/// The first value of `key` in a query string, percent-decoded.
fn query_value(query: &str, key: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

fn refused(status: u16, why: &str) -> Answer {
    (status, format!("{}\n", json!({ "error": why })))
}

#[cfg(test)]
mod tests {
    use super::query_value;

    #[test]
    fn query_values_are_percent_decoded() {
        let q = "user=al%20ice&client=dev%2F7%2B";
        assert_eq!(query_value(q, "user").as_deref(), Some("al ice"));
        assert_eq!(query_value(q, "client").as_deref(), Some("dev/7+"));
        assert_eq!(query_value(q, "other"), None);
        assert_eq!(query_value("", "user"), None);
    }
}
