//! Decodes and re-encodes the shared wire vectors (protocol/testdata/vectors),
//! as every Sinew client does, so the crate stays byte-compatible with the Go
//! encoder.

use serde_json::{json, Map, Value};
use sinew::wire::{self, Body};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{:02x}", x)).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn s64(v: u64) -> Value {
    Value::String(v.to_string())
}

fn i64s(v: i64) -> Value {
    Value::String(v.to_string())
}

fn headers(hs: &[(String, String)]) -> Value {
    Value::Array(hs.iter().map(|(k, v)| json!({"key": k, "value": v})).collect())
}

fn lease(l: &wire::LeaseRef) -> Value {
    json!({"sub_id": s64(l.sub_id), "partition": l.partition, "offset": s64(l.offset),
           "lease_id": s64(l.lease_id), "epoch": s64(l.epoch)})
}

fn view(v: &wire::SubView) -> Value {
    json!({"sub_id": s64(v.sub_id), "topic": v.topic, "group": v.group, "partition": v.partition,
           "ack_mode": v.ack_mode, "prefetch": v.prefetch})
}

fn resume(r: &wire::ResumeIdentity) -> Value {
    json!({"client_id": r.client_id, "owner_id": r.owner_id, "token": hex(&r.token)})
}

fn settle(s: &wire::Settle) -> Value {
    json!({"tags": s.tags.iter().map(|t| s64(*t)).collect::<Vec<_>>(), "delay_ms": i64s(s.delay_ms),
           "leases": s.leases.iter().map(lease).collect::<Vec<_>>()})
}

/// The body as the vectors' `fields` spell it.
fn fields(b: &Body) -> Value {
    match b {
        Body::Hello(h) => json!({"protocol_version": h.protocol_version, "client_name": h.client_name,
            "client_version": h.client_version, "credentials": h.credentials, "resume": resume(&h.resume),
            "user": h.user}),
        Body::HelloOk(h) => json!({"protocol_version": h.protocol_version, "server_version": h.server_version,
            "resume": resume(&h.resume), "outcome": h.outcome, "server_generation": s64(h.server_generation),
            "heartbeat_ms": h.heartbeat_ms, "reconnect_grace_ms": h.reconnect_grace_ms,
            "limits": {"frame_bytes_max": h.limits.frame_bytes_max, "body_bytes_max": h.limits.body_bytes_max,
                "prefetch_max": h.limits.prefetch_max, "settle_batch_max": h.limits.settle_batch_max,
                "publish_inflight_max": h.limits.publish_inflight_max,
                "subscriptions_max": h.limits.subscriptions_max},
            "cluster": h.cluster}),
        Body::Ping | Body::Pong | Body::Ok | Body::EndSession => json!({}),
        Body::Error(e) => json!({"code": e.code, "message": e.message, "fatal": e.fatal, "owner": e.owner}),
        Body::DeclareQueue(d) => json!({"topic": d.topic, "group": d.group, "partitions": d.partitions,
            "dead_letter_mode": d.dead_letter_mode, "dead_letter_target": d.dead_letter_target,
            "max_retries": d.max_retries, "default_ttl_ms": i64s(d.default_ttl_ms), "lease_ms": i64s(d.lease_ms)}),
        Body::DeclareOk(d) => json!({"partitions": d.partitions, "created": d.created}),
        Body::Publish(p) => json!({"topic": p.topic, "group": p.group, "partition": p.partition,
            "key": hex(&p.key), "headers": headers(&p.headers), "content_type": p.content_type,
            "delay_ms": i64s(p.delay_ms), "not_before_ms": i64s(p.not_before_ms), "ttl_ms": i64s(p.ttl_ms),
            "producer_id": p.producer_id, "producer_seq": s64(p.producer_seq), "body": hex(&p.body),
            "producer_prev": s64(p.producer_prev)}),
        Body::PublishOk(p) => json!({"partition": p.partition, "offset": s64(p.offset), "duplicate": p.duplicate,
            "next": p.next}),
        Body::DeleteQueue(q) | Body::PurgeQueue(q) | Body::Metadata(q) => json!({"topic": q.topic, "group": q.group}),
        Body::PurgeOk(n) => json!({"purged": s64(*n)}),
        Body::Subscribe(s) => json!({"topic": s.topic, "group": s.group, "partition": s.partition,
            "ack_mode": s.ack_mode, "prefetch": s.prefetch, "cohort": s.cohort, "member": s.member}),
        Body::SubscribeOk(s) => json!({"sub_id": s64(s.sub_id), "partitions": s.partitions, "prefetch": s.prefetch}),
        Body::Unsubscribe(id) => json!({"sub_id": s64(*id)}),
        Body::SubClosed(s) => json!({"sub_id": s64(s.sub_id), "reason": s.reason, "code": s.code,
            "message": s.message}),
        Body::Deliver(d) => json!({"sub_id": s64(d.sub_id), "tag": s64(d.tag), "partition": d.partition,
            "offset": s64(d.offset), "attempt": d.attempt, "published_at_ms": i64s(d.published_at_ms),
            "key": hex(&d.key), "headers": headers(&d.headers), "content_type": d.content_type,
            "body": hex(&d.body), "topic": d.topic, "group": d.group, "lease_id": s64(d.lease_id),
            "epoch": s64(d.epoch), "lease_ms": d.lease_ms, "assignment": s64(d.assignment)}),
        Body::Assignment(a) => json!({"sub_id": s64(a.sub_id), "partition": a.partition, "epoch": s64(a.epoch),
            "state": a.state}),
        Body::Ack(s) | Body::Nack(s) | Body::Fail(s) => settle(s),
        Body::Extend(e) => json!({"tags": e.tags.iter().map(|t| s64(*t)).collect::<Vec<_>>(),
            "extend_ms": i64s(e.extend_ms), "leases": e.leases.iter().map(lease).collect::<Vec<_>>()}),
        Body::SettleResult(s) => json!({"codes": s.codes}),
        Body::GoingAway(g) => json!({"deadline_ms": i64s(g.deadline_ms), "grace_ms": g.grace_ms,
            "reason": g.reason, "redirect": g.redirect}),
        Body::Reconcile(r) => json!({"policy": r.policy, "subs": r.subs.iter().map(view).collect::<Vec<_>>(),
            "inflight_follows": r.inflight_follows,
            "cohorts": r.cohorts.iter().map(|c| json!({"sub_id": s64(c.sub_id), "cohort": c.cohort,
                "member": c.member})).collect::<Vec<_>>()}),
        Body::ReconcileResult(r) => json!({"entries": r.entries.iter().map(|e| json!({"action": e.action,
            "client_sub_id": s64(e.client_sub_id), "server_sub_id": s64(e.server_sub_id),
            "client": view(&e.client), "server": view(&e.server), "reason": e.reason})).collect::<Vec<_>>()}),
        Body::Inflight(i) => json!({"entries": i.entries.iter().map(|e| json!({"tag": s64(e.tag),
            "lease": lease(&e.lease)})).collect::<Vec<_>>()}),
        Body::InflightResult(i) => json!({"stale": i.stale.iter().map(|t| s64(*t)).collect::<Vec<_>>(),
            "resent": s64(i.resent), "kept": s64(i.kept)}),
        Body::MetadataResult(m) => json!({"cluster": m.cluster, "partitions": m.partitions.iter().map(|p| json!({
            "partition": p.partition, "owner": p.owner, "epoch": s64(p.epoch), "replicas": p.replicas}))
            .collect::<Vec<_>>()}),
    }
}

/// Compares what the vector lists with what we decoded. A field the vector
/// leaves out must be absent from ours too, except where ours is a zero
/// value of a field the Go encoder leaves out when unset.
fn same(want: &Value, got: &Value, path: &str, errs: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                match g.get(k) {
                    Some(gv) => same(wv, gv, &format!("{}.{}", path, k), errs),
                    None => errs.push(format!("{}.{}: missing from the decoded body", path, k)),
                }
            }
            for (k, gv) in g {
                if !w.contains_key(k) && !is_zero(gv) {
                    errs.push(format!("{}.{}: decoded {} but the vector has no such field", path, k, gv));
                }
            }
        }
        (Value::Array(w), Value::Array(g)) => {
            if w.len() != g.len() {
                errs.push(format!("{}: {} items, want {}", path, g.len(), w.len()));
                return;
            }
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                same(wv, gv, &format!("{}[{}]", path, i), errs);
            }
        }
        _ => {
            if want != got {
                errs.push(format!("{}: got {}, want {}", path, got, want));
            }
        }
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty() || s == "0",
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Bool(b) => !b,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_zero),
        Value::Null => true,
    }
}

#[test]
fn wire_vectors() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../protocol/testdata/vectors/frames.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("read frames.json")).unwrap();
    assert_eq!(doc["format"], 1);
    let vectors = doc["vectors"].as_array().unwrap();
    assert!(vectors.len() > 50, "only {} vectors", vectors.len());
    let (mut decoded, mut reencoded, mut refused) = (0, 0, 0);
    let mut errs = Vec::new();
    for v in vectors {
        let name = v["name"].as_str().unwrap();
        let data = unhex(v["hex"].as_str().unwrap());
        let (h, body) = wire::split_frame(&data).unwrap_or_else(|e| panic!("{}: header: {}", name, e));
        assert_eq!(u64::from(h.op), v["op"].as_u64().unwrap(), "{}: op", name);
        assert_eq!(u64::from(h.flags), v["flags"].as_u64().unwrap(), "{}: flags", name);
        assert_eq!(h.req_id.to_string(), v["request_id"].as_str().unwrap(), "{}: request id", name);
        let want_err = v.get("error").and_then(|e| e.as_str()).unwrap_or("");
        let got = Body::decode(h.op, body);
        if !want_err.is_empty() {
            assert_eq!(want_err, "bad_frame", "{}", name);
            assert!(got.is_err(), "{}: decoded a frame that must be refused: {:?}", name, got);
            refused += 1;
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{}: decode: {}", name, e));
        let mut e = Vec::new();
        same(&v["fields"], &fields(&got), name, &mut e);
        errs.extend(e);
        decoded += 1;
        if v.get("decode_only").and_then(|d| d.as_bool()).unwrap_or(false) {
            continue;
        }
        let again = wire::encode_frame(&got, h.req_id, h.flags);
        if again != data {
            errs.push(format!("{}: re-encoded\n  {}\nwant\n  {}", name, hex(&again), hex(&data)));
        }
        reencoded += 1;
    }
    assert!(errs.is_empty(), "{} mismatches:\n{}", errs.len(), errs.join("\n"));
    eprintln!("wire vectors: {} decoded, {} re-encoded, {} refused", decoded, reencoded, refused);
    assert!(reencoded > 40 && refused > 0);
    let _ = Map::<String, Value>::new();
}
