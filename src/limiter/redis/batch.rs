//! One script call of `lua/batch.lua`: the operations of one hash slot in
//! arrival order, the keys they touch (each once), the call's record key,
//! and the reading of its reply. The cancel of a call (`lua/cancel.lua`)
//! is built from the same parts.

use std::sync::Arc;

use redis::{Cmd, Script};

use crate::limiter::bucket::{BucketSpec, Draw, Plan};
use crate::limiter::keys::call_record_key;
use crate::limiter::overrun;
use crate::limiter::shapes::{self, Disagreement};
use crate::limiter::{
    Adjustment, Decision, DrawMark, DrawMarks, LoweredTotals, Lowering, StoreError,
    decision_from_plan,
};

/// One operation of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    /// Reserve every draw's cost if all fit within `max_wait_ms`, else none.
    Acquire { draws: Vec<Draw>, max_wait_ms: u64 },
    /// Refunds and debits of a settlement.
    Settle(Vec<Adjustment>),
    /// Buckets lowered to the provider's view.
    Lower(Vec<Lowering>),
}

/// What a batch answered for one operation.
pub type OpResult = Result<Option<Decision>, StoreError>;

impl BatchOp {
    /// The key whose hash tag decides the slot (and so the batch) of the op.
    pub fn slot_key(&self) -> Option<Arc<str>> {
        let key = match self {
            BatchOp::Acquire { draws, .. } => &draws.first()?.bucket.key,
            BatchOp::Settle(adjustments) => &adjustments.first()?.bucket.key,
            BatchOp::Lower(lowerings) => &lowerings.first()?.bucket.key,
        };
        Some(key.clone())
    }

    /// Calls `f` with the bucket of each draw, adjustment or lowering.
    fn for_each_bucket(&self, mut f: impl FnMut(&BucketSpec)) {
        match self {
            BatchOp::Acquire { draws, .. } => draws.iter().for_each(|draw| f(&draw.bucket)),
            BatchOp::Settle(adjustments) => adjustments.iter().for_each(|a| f(&a.bucket)),
            BatchOp::Lower(lowerings) => lowerings.iter().for_each(|l| f(&l.bucket)),
        }
    }

    pub fn is_acquire(&self) -> bool {
        matches!(self, BatchOp::Acquire { .. })
    }
}

/// How a call ended, from its reply.
#[derive(Debug)]
pub(super) enum CallReply {
    /// It ran (now, or on an earlier attempt): one result per operation,
    /// `None` for a settlement; and the buckets it drew with another
    /// sidecar's shape as well.
    Ran(Vec<OpResult>, Vec<Disagreement>),
    /// A cancel got there first: it did nothing.
    Cancelled,
}

/// A batch ready to send: its operations and the keys they touch.
#[derive(Debug, Clone)]
pub(super) struct Call {
    /// `KEYS[1]`, the record; then each bucket once, in order of first use.
    keys: Vec<Arc<str>>,
    /// The shape of each bucket of `keys[1..]` as its first operation in
    /// the call has it: sent once a call, not with every draw, and what the
    /// cancel refills with.
    shapes: Vec<Shape>,
    /// Where a bucket's shape changes within the call (a config reload
    /// between two of its operations), in order: almost always none.
    reshapes: Vec<Reshape>,
    ops: Vec<BatchOp>,
    /// Per op and draw (or adjustment): its bucket's index into `keys`.
    indices: Vec<Vec<usize>>,
}

/// A bucket's shape as the script takes it, in units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    capacity: i64,
    units_per_ms: i64,
    /// The largest cost (with its floor) one acquire may take.
    largest: i64,
    /// When a bucket that never refills may be forgotten (Unix ms; 0: none).
    keep_until: i64,
    /// Not sent: what turns the script's units back into tokens.
    units_per_token: i64,
}

impl Shape {
    fn of(bucket: &BucketSpec) -> Shape {
        Shape {
            capacity: bucket.capacity_units(),
            units_per_ms: bucket.units_per_ms(),
            largest: bucket.largest_units(),
            keep_until: bucket.keep_until_arg(),
            units_per_token: bucket.refill.units_per_token(),
        }
    }

    /// A shape of `capacity` units refilled `units_per_ms`, in tokens, as
    /// this bucket counts them.
    fn in_tokens(&self, capacity: i64, units_per_ms: i64) -> shapes::Shape {
        let per_token = self.units_per_token.max(1);
        shapes::Shape {
            capacity: (capacity / per_token).max(0) as u64,
            per_minute: (units_per_ms.max(0) as u64).saturating_mul(60_000) / per_token as u64,
        }
    }
}

/// A bucket's new shape, from operation `before_op` of the call on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reshape {
    before_op: usize,
    /// Into `keys`, as Lua counts.
    index: usize,
    shape: Shape,
}

impl Call {
    /// A call of `ops` (at least one, all of one slot) under a fresh id.
    pub(super) fn new(ops: Vec<BatchOp>, id: u64) -> Call {
        let slot_key = ops.iter().find_map(BatchOp::slot_key);
        let slot_key = slot_key.as_deref().unwrap_or("");
        let mut keys: Vec<Arc<str>> = vec![call_record_key(slot_key, id).into()];
        let mut shapes: Vec<Shape> = Vec::new();
        let mut reshapes: Vec<Reshape> = Vec::new();
        let mut indices = Vec::with_capacity(ops.len());
        for (at, op) in ops.iter().enumerate() {
            let mut op_indices = Vec::new();
            op.for_each_bucket(|bucket| {
                let shape = Shape::of(bucket);
                // Batches touch a handful of buckets: a scan beats a map.
                let index = match keys[1..].iter().position(|key| *key == bucket.key) {
                    Some(found) => {
                        let latest = reshapes
                            .iter()
                            .rev()
                            .find(|reshape| reshape.index == found + 2)
                            .map_or(shapes[found], |reshape| reshape.shape);
                        if latest != shape {
                            reshapes.push(Reshape {
                                before_op: at,
                                index: found + 2,
                                shape,
                            });
                        }
                        found + 2
                    }
                    None => {
                        keys.push(bucket.key.clone());
                        shapes.push(shape);
                        keys.len()
                    }
                };
                op_indices.push(index);
            });
            indices.push(op_indices);
        }
        Call {
            keys,
            shapes,
            reshapes,
            ops,
            indices,
        }
    }

    /// The `EVALSHA` of `lua/batch.lua` for this call. The arguments after
    /// the keys go packed in one msgpack array: one bulk string for Redis to
    /// parse and hand to Lua instead of nine an acquire.
    /// `sidecar` names this daemon to the script, which tells its shapes
    /// from other sidecars'.
    pub(super) fn command(
        &self,
        script: &Script,
        clock: &str,
        record_ttl_ms: u64,
        sidecar: &str,
    ) -> Cmd {
        let mut cmd = evalsha(script, &self.keys);
        let reshaped_ops = self
            .reshapes
            .iter()
            .enumerate()
            .filter(|(i, reshape)| *i == 0 || self.reshapes[i - 1].before_op != reshape.before_op)
            .count();
        let mut args = PackedArgs::new();
        args.text(clock)
            .uint(record_ttl_ms)
            .size(self.ops.len() + reshaped_ops)
            .text(sidecar);
        for shape in &self.shapes {
            args.int(shape.capacity)
                .int(shape.units_per_ms)
                .int(shape.largest)
                .int(shape.keep_until);
        }
        let mut reshapes = self.reshapes.as_slice();
        for (at, (op, indices)) in self.ops.iter().zip(&self.indices).enumerate() {
            let here = reshapes
                .iter()
                .take_while(|reshape| reshape.before_op == at)
                .count();
            if here > 0 {
                args.text("c").size(here);
                for reshape in &reshapes[..here] {
                    args.size(reshape.index)
                        .int(reshape.shape.capacity)
                        .int(reshape.shape.units_per_ms)
                        .int(reshape.shape.largest)
                        .int(reshape.shape.keep_until);
                }
                reshapes = &reshapes[here..];
            }
            match op {
                BatchOp::Acquire { draws, max_wait_ms } => {
                    args.text("a").uint(*max_wait_ms).size(draws.len());
                    for (draw, index) in draws.iter().zip(indices) {
                        let bucket = &draw.bucket;
                        args.size(*index)
                            .int(bucket.units(draw.cost))
                            .int(bucket.units(draw.floor));
                    }
                }
                BatchOp::Settle(adjustments) => {
                    args.text("s").size(adjustments.len());
                    for (adjustment, index) in adjustments.iter().zip(indices) {
                        args.size(*index)
                            .int(adjustment.bucket.signed_units(adjustment.tokens));
                    }
                }
                BatchOp::Lower(lowerings) => {
                    args.text("l").size(lowerings.len());
                    for (lowering, index) in lowerings.iter().zip(indices) {
                        let bucket = &lowering.bucket;
                        let (remaining, reserved_ms_ago, counted_ms_ago, drawn, refused) =
                            match lowering.fleet {
                                Some(fleet) => (
                                    bucket.signed_units(fleet.remaining),
                                    fleet.reserved_ms_ago.map_or(-1, |ago| ago as i64),
                                    fleet.counted_ms_ago.min(i64::MAX as u64) as i64,
                                    fleet.drawn.map_or(-1, |mark| mark.max(0)),
                                    bucket.units(fleet.refused),
                                ),
                                None => (-1, -1, 0, -1, 0),
                            };
                        args.size(*index)
                            .int(bucket.signed_units(lowering.level))
                            .int(remaining)
                            .int(reserved_ms_ago)
                            .int(counted_ms_ago)
                            .int(drawn)
                            .int(refused);
                    }
                }
            }
        }
        cmd.arg(args.finish());
        cmd
    }

    /// The `EVALSHA` of `lua/cancel.lua` that undoes this call or keeps it
    /// from running.
    pub(super) fn cancel_command(
        &self,
        script: &Script,
        clock: &str,
        tombstone_ttl_ms: u64,
    ) -> Cmd {
        let mut cmd = evalsha(script, &self.keys);
        cmd.arg(clock).arg(tombstone_ttl_ms);
        for shape in &self.shapes {
            cmd.arg(shape.capacity)
                .arg(shape.units_per_ms)
                .arg(shape.keep_until);
        }
        cmd
    }

    /// Reads the script's reply: one list of integers per element. The
    /// counts of lowered units it gives go to `lowered`.
    pub(super) fn read_reply(
        &self,
        reply: &[Vec<i64>],
        lowered: &Arc<LoweredTotals>,
    ) -> Result<CallReply, StoreError> {
        let (status, replies) = match reply.split_first() {
            Some((status, replies)) => (status.as_slice(), replies),
            None => return Err(unexpected_reply(&[])),
        };
        let disagreements = match status {
            [0] => return Ok(CallReply::Cancelled),
            [1, others @ ..] | [2, others @ ..]
                if replies.len() == self.ops.len() && others.len() % 3 == 0 =>
            {
                self.disagreements(others)
                    .ok_or_else(|| unexpected_reply(status))?
            }
            _ => return Err(unexpected_reply(status)),
        };
        let mut results = Vec::with_capacity(self.ops.len());
        for (op, reply) in self.ops.iter().zip(replies) {
            results.push(match (op, reply.as_slice()) {
                (BatchOp::Settle(adjustments), [2, clips @ ..]) if clips.len() % 2 == 0 => {
                    // Overruns the bucket's overrun debt did not let it take.
                    for clip in clips.chunks_exact(2) {
                        let change = usize::try_from(clip[0] - 1).ok();
                        match change.and_then(|change| adjustments.get(change)) {
                            Some(adjustment) => overrun::clipped(&adjustment.bucket, clip[1]),
                            None => return Err(unexpected_reply(reply)),
                        }
                    }
                    Ok(None)
                }
                (BatchOp::Lower(lowerings), [3, counts @ ..]) => {
                    for (lowering, count) in lowerings.iter().zip(counts) {
                        lowered.note(&lowering.bucket.key, *count);
                    }
                    Ok(None)
                }
                (BatchOp::Acquire { draws, .. }, reply) => {
                    let decision = decision_from_plan(draws, acquire_plan(reply, draws.len())?);
                    decision.map(|decision| {
                        let decision = with_marks(decision, draws, reply, lowered);
                        if let Decision::Granted {
                            marks: Some(marks), ..
                        } = &decision
                        {
                            for mark in marks.draws.iter() {
                                lowered.note(&mark.key, mark.lowered);
                            }
                        }
                        Some(decision)
                    })
                }
                (_, other) => return Err(unexpected_reply(other)),
            });
        }
        Ok(CallReply::Ran(results, disagreements))
    }

    /// The status's triples (key index, capacity, rate) of buckets drawn
    /// with another sidecar's shape; `None` for an index out of range.
    fn disagreements(&self, triples: &[i64]) -> Option<Vec<Disagreement>> {
        triples
            .chunks_exact(3)
            .map(|triple| {
                let at = usize::try_from(triple[0]).ok()?.checked_sub(2)?;
                let shape = self.shapes.get(at)?;
                Some(Disagreement {
                    key: self.keys.get(at + 1)?.clone(),
                    ours: shape.in_tokens(shape.capacity, shape.units_per_ms),
                    theirs: shape.in_tokens(triple[1], triple[2]),
                })
            })
            .collect()
    }
}

/// Script arguments packed as one msgpack array, in the order
/// `lua/batch.lua` reads them (it unpacks the array with `cmsgpack`).
struct PackedArgs {
    buf: Vec<u8>,
    count: u32,
}

impl PackedArgs {
    /// The array's marker and length come first: array32, its length
    /// written once the arguments are in.
    fn new() -> Self {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&[0xdd, 0, 0, 0, 0]);
        PackedArgs { buf, count: 0 }
    }

    // Writing to a Vec cannot fail: the results are not errors to handle.
    fn int(&mut self, value: i64) -> &mut Self {
        let _ = rmp::encode::write_sint(&mut self.buf, value);
        self.count += 1;
        self
    }

    fn uint(&mut self, value: u64) -> &mut Self {
        let _ = rmp::encode::write_uint(&mut self.buf, value);
        self.count += 1;
        self
    }

    fn size(&mut self, value: usize) -> &mut Self {
        self.uint(value as u64)
    }

    fn text(&mut self, value: &str) -> &mut Self {
        let _ = rmp::encode::write_str(&mut self.buf, value);
        self.count += 1;
        self
    }

    fn finish(mut self) -> Vec<u8> {
        self.buf[1..5].copy_from_slice(&self.count.to_be_bytes());
        self.buf
    }
}

/// `EVALSHA` of `script` with `keys`; the arguments follow.
pub(super) fn evalsha<K: AsRef<str>>(script: &Script, keys: &[K]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len());
    for key in keys {
        cmd.arg(key.as_ref());
    }
    cmd
}

/// A grant with the marks its reply gave after the wait, two per draw: its
/// bucket's count of units drawn, then of units lowered (a script of before
/// they were given sends none, or only the first).
fn with_marks(
    decision: Decision,
    draws: &[Draw],
    reply: &[i64],
    lowered: &Arc<LoweredTotals>,
) -> Decision {
    match decision {
        Decision::Granted {
            wait_ms, origin, ..
        } if reply.len() >= 2 + draws.len() => {
            let drawn = &reply[2..2 + draws.len()];
            let lowered_then = reply.get(2 + draws.len()..).unwrap_or_default();
            Decision::Granted {
                wait_ms,
                origin,
                marks: Some(DrawMarks {
                    draws: draws
                        .iter()
                        .enumerate()
                        .map(|(at, draw)| DrawMark {
                            key: draw.bucket.key.clone(),
                            drawn: Some(drawn[at]),
                            lowered: lowered_then.get(at).copied().unwrap_or(0),
                            units_per_ms: draw.bucket.units_per_ms(),
                        })
                        .collect(),
                    lowered: lowered.clone(),
                }),
            }
        }
        other => other,
    }
}

fn acquire_plan(reply: &[i64], draws: usize) -> Result<Plan, StoreError> {
    Ok(match reply {
        [1, wait_ms, ..] => Plan::Grant {
            wait_ms: non_negative(*wait_ms),
        },
        [0, retry_after_ms, draw] => Plan::Deny {
            retry_after_ms: non_negative(*retry_after_ms),
            bucket: draw_index(*draw, draws, reply)?,
        },
        [-1, draw] => Plan::Impossible {
            bucket: draw_index(*draw, draws, reply)?,
        },
        other => return Err(unexpected_reply(other)),
    })
}

fn non_negative(value: i64) -> u64 {
    value.max(0) as u64
}

fn draw_index(one_based: i64, draws: usize, reply: &[i64]) -> Result<usize, StoreError> {
    usize::try_from(one_based - 1)
        .ok()
        .filter(|&index| index < draws)
        .ok_or_else(|| unexpected_reply(reply))
}

pub(super) fn unexpected_reply(reply: &[i64]) -> StoreError {
    StoreError::Unavailable(format!("unexpected reply from a Redis script: {reply:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(key: &str) -> BucketSpec {
        BucketSpec::per_minute(key, 100, 60)
    }

    fn acquire(keys: &[&str], cost: u64) -> BatchOp {
        BatchOp::Acquire {
            draws: keys
                .iter()
                .map(|key| Draw {
                    bucket: bucket(key),
                    cost,
                    floor: 0,
                })
                .collect(),
            max_wait_ms: 0,
        }
    }

    #[test]
    fn each_bucket_is_one_key_and_the_record_shares_the_slot() {
        let settle = BatchOp::Settle(vec![Adjustment {
            bucket: bucket("rk:{l:a}:a:tokens"),
            tokens: 5,
        }]);
        let ops = vec![
            acquire(&["rk:{l:a}:a:tokens", "rk:{l:a}:a:requests"], 10),
            settle,
            acquire(&["rk:{l:a}:a:requests", "rk:{l:a}:a:tokens"], 1),
        ];
        let call = Call::new(ops, 0xab);
        let keys: Vec<&str> = call.keys.iter().map(|key| &**key).collect();
        assert_eq!(
            keys,
            [
                "rk:{l:a}:call:00000000000000ab",
                "rk:{l:a}:a:tokens",
                "rk:{l:a}:a:requests"
            ]
        );
        assert_eq!(call.indices, vec![vec![2, 3], vec![2], vec![3, 2]]);
    }

    /// The arguments after the keys, unpacked from their one msgpack
    /// array, as text.
    fn arguments(call: &Call) -> Vec<String> {
        let script = Script::new("return 1");
        let command = call.command(&script, "", 10_000, "s1");
        let packed: Vec<&[u8]> = command
            .args_iter()
            .skip(3 + call.keys.len()) // EVALSHA, the hash, the number of keys
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes,
                other => panic!("not a plain argument: {other:?}"),
            })
            .collect();
        assert_eq!(packed.len(), 1, "the arguments go as one");
        let mut rest = packed[0];
        let count = rmp::decode::read_array_len(&mut rest).unwrap();
        let values = (0..count)
            .map(|_| {
                if matches!(rest[0], 0xa0..=0xbf | 0xd9) {
                    let len = rmp::decode::read_str_len(&mut rest).unwrap() as usize;
                    let (text, after) = rest.split_at(len);
                    rest = after;
                    String::from_utf8(text.to_vec()).unwrap()
                } else {
                    rmp::decode::read_int::<i64, _>(&mut rest)
                        .unwrap()
                        .to_string()
                }
            })
            .collect();
        assert!(rest.is_empty(), "nothing follows the array");
        values
    }

    #[test]
    fn shapes_go_once_a_call_and_a_reload_within_it_reshapes_its_bucket() {
        let tokens = "rk:{l:a}:a:tokens";
        let ops = vec![acquire(&[tokens], 10), acquire(&[tokens], 1)];
        // 100 tokens a minute of 60 000 units, refilling 60 units a ms, and
        // the largest cost (the capacity).
        assert_eq!(
            arguments(&Call::new(ops.clone(), 1)),
            [
                "", "10000", "2", "s1", "6000000", "60", "6000000", "0", "a", "0", "1", "2",
                "600000", "0", "a", "0", "1", "2", "60000", "0"
            ]
        );
        let reloaded = BatchOp::Acquire {
            draws: vec![Draw {
                bucket: BucketSpec::per_minute(tokens, 200, 120),
                cost: 1,
                floor: 0,
            }],
            max_wait_ms: 0,
        };
        let call = Call::new(vec![ops[0].clone(), reloaded, ops[1].clone()], 1);
        assert_eq!(
            arguments(&call)[..],
            [
                "", "10000", "5", "s1", "6000000", "60", "6000000", "0", "a", "0", "1", "2",
                "600000", "0", "c", "1", "2", "12000000", "120", "12000000", "0", "a", "0", "1",
                "2", "60000", "0", "c", "1", "2", "6000000", "60", "6000000", "0", "a", "0", "1",
                "2", "60000", "0"
            ]
        );
    }

    #[test]
    fn a_never_refilling_bucket_goes_with_rate_0_and_its_keep_until_instant() {
        let budget = BucketSpec::never_refilled("rk:{l:a}:a:budget:day:2026-12-07", 5_000, 1_234);
        let spend = |cost| BatchOp::Acquire {
            draws: vec![Draw {
                bucket: budget.clone(),
                cost,
                floor: 0,
            }],
            max_wait_ms: 0,
        };
        // One unit a token; capacity, rate 0, largest, keep-until.
        assert_eq!(
            arguments(&Call::new(vec![spend(7)], 1)),
            [
                "", "10000", "1", "s1", "5000", "0", "5000", "1234", "a", "0", "1", "2", "7", "0"
            ]
        );
        // Another instant is another shape: the call re-sends it.
        let later = BatchOp::Acquire {
            draws: vec![Draw {
                bucket: BucketSpec::never_refilled(budget.key.clone(), 5_000, 9_999),
                cost: 1,
                floor: 0,
            }],
            max_wait_ms: 0,
        };
        assert_eq!(
            arguments(&Call::new(vec![spend(7), later], 1))[14..],
            [
                "c", "1", "2", "5000", "0", "5000", "9999", "a", "0", "1", "2", "1", "0"
            ]
        );
        let call = Call::new(vec![spend(7)], 1);
        let cancel = call.cancel_command(&Script::new("return 1"), "", 60_000);
        let args: Vec<String> = cancel
            .args_iter()
            .skip(3 + call.keys.len())
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                other => panic!("not a plain argument: {other:?}"),
            })
            .collect();
        assert_eq!(args, ["", "60000", "5000", "0", "1234"]);
    }

    #[test]
    fn replies_become_decisions_in_order() {
        let call = Call::new(
            vec![
                acquire(&["{t}:a"], 10),
                acquire(&["{t}:a", "{t}:b"], 10),
                BatchOp::Settle(vec![]),
                acquire(&["{t}:a"], 200),
            ],
            1,
        );
        let reply = vec![vec![1], vec![1, 0], vec![0, 30, 2], vec![2], vec![-1, 1]];
        let CallReply::Ran(results, _) = call.read_reply(&reply, &Arc::default()).unwrap() else {
            panic!("ran");
        };
        assert!(matches!(
            results[0],
            Ok(Some(Decision::Granted { wait_ms: 0, .. }))
        ));
        assert!(matches!(
            results[1],
            Ok(Some(Decision::Denied {
                retry_after_ms: 30,
                bucket: 1
            }))
        ));
        assert!(matches!(results[2], Ok(None)));
        assert!(matches!(
            results[3],
            Err(StoreError::CostExceedsCapacity { .. })
        ));
        assert!(matches!(
            call.read_reply(&[vec![0]], &Arc::default()),
            Ok(CallReply::Cancelled)
        ));
        assert!(
            call.read_reply(&[vec![1], vec![1, 0]], &Arc::default())
                .is_err(),
            "too few"
        );
        assert!(
            call.read_reply(
                &[vec![1], vec![0, 1, 9], vec![0, 1, 1], vec![2], vec![2]],
                &Arc::default()
            )
            .is_err(),
            "a draw out of range, a settlement answered as an acquire"
        );
    }
}
