//! The change feed over DynamoDB Streams (`NEW_AND_OLD_IMAGES`, enabled by
//! [`crate::create_table`]), read with the official streams client.
//!
//! A stream is a tree of shards: each shard holds the records of some items in order and,
//! when it closes, its children continue them. [`read`] therefore reads a shard only once its
//! parent is finished (read to its end, or no longer listed: trimmed after 24 hours), so the
//! changes of one item always come in order. The cursor holds, per shard, the last sequence
//! number consumed, or [`tollgate_store::feed::STREAM_DONE`] once a closed shard was read to
//! its end; shards the stream no longer lists are dropped from it.
//!
//! Each call lists the shards (`DescribeStream`, paginated), then for each readable shard gets
//! an iterator after its cursor position (`AFTER_SEQUENCE_NUMBER`, or `TRIM_HORIZON` for a shard
//! never read) and reads pages (`GetRecords`) until it has `limit` changes or the shard has
//! nothing more for now. Iterators are not kept between calls: they expire after 15 minutes,
//! and a cursor is all a restarted consumer has.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodbstreams::types::{AttributeValue, Record, ShardIteratorType};
use aws_sdk_dynamodbstreams::Client;
use tollgate_core::value::{Item, Key, Value};
use tollgate_store::{Change, FeedBatch, FeedCursor, FeedPosition, StoreError};

use crate::error::{map_sdk, Effect};

/// Most empty pages read from one open shard in one call before moving on (the service may
/// return empty pages before the records at a new iterator).
const EMPTY_PAGES: usize = 3;

/// Decode one stream attribute value into the item model.
fn value(attr: &str, av: &AttributeValue) -> Result<Value, StoreError> {
    Ok(match av {
        AttributeValue::N(n) => Value::N(n.trim().parse::<i64>().map_err(|e| {
            StoreError::Corrupt(format!("stream image: attribute {attr}: number {n:?}: {e}"))
        })?),
        AttributeValue::S(s) => Value::S(s.clone()),
        AttributeValue::Bool(b) => Value::Bool(*b),
        AttributeValue::Ss(ss) => Value::Ss(Box::new(ss.iter().cloned().collect())),
        AttributeValue::M(m) => Value::M(Box::new(
            m.iter()
                .map(|(k, v)| Ok((k.clone(), value(&format!("{attr}.{k}"), v)?)))
                .collect::<Result<_, StoreError>>()?,
        )),
        AttributeValue::L(l) => Value::L(Box::new(
            l.iter()
                .enumerate()
                .map(|(i, v)| value(&format!("{attr}[{i}]"), v))
                .collect::<Result<_, _>>()?,
        )),
        AttributeValue::Null(_) => Value::Null,
        other => {
            return Err(StoreError::Corrupt(format!(
                "stream image: attribute {attr}: a type the item model does not hold ({other:?})"
            )))
        }
    })
}

fn image(map: Option<&HashMap<String, AttributeValue>>) -> Result<Option<Item>, StoreError> {
    map.filter(|m| !m.is_empty())
        .map(|m| {
            m.iter()
                .map(|(k, v)| Ok((k.as_str().into(), value(k, v)?)))
                .collect::<Result<Item, StoreError>>()
        })
        .transpose()
}

/// One stream record as a change of shard `shard`.
fn change(shard: &str, r: &Record) -> Result<Change, StoreError> {
    let Some(d) = r.dynamodb() else {
        return Err(StoreError::Corrupt("stream record without a body".into()));
    };
    let seq = d
        .sequence_number()
        .ok_or_else(|| StoreError::Corrupt("stream record without a sequence number".into()))?;
    let keys = image(d.keys())?.unwrap_or_default();
    let key = match (
        keys.get("PK").and_then(Value::as_s),
        keys.get("SK").and_then(Value::as_s),
    ) {
        (Some(pk), Some(sk)) => Key::new(pk, sk),
        _ => {
            return Err(StoreError::Corrupt(format!(
                "stream record {seq}: keys are not PK/SK strings"
            )))
        }
    };
    let at_ms = d
        .approximate_creation_date_time()
        .and_then(|t| t.to_millis().ok())
        .unwrap_or(0);
    Ok(Change {
        position: FeedPosition {
            stream: shard.to_string(),
            seq: seq.to_string(),
        },
        key,
        old: image(d.old_image())?.map(std::sync::Arc::new),
        new: image(d.new_image())?.map(std::sync::Arc::new),
        at_ms,
    })
}

/// A shard as listed: its parent and whether it is closed.
#[derive(Debug)]
struct ShardInfo {
    parent: Option<String>,
    closed: bool,
}

async fn shards(
    client: &Client,
    arn: &str,
    table: &str,
) -> Result<BTreeMap<String, ShardInfo>, StoreError> {
    let mut out = BTreeMap::new();
    let mut start: Option<String> = None;
    loop {
        let r = client
            .describe_stream()
            .stream_arn(arn)
            .set_exclusive_start_shard_id(start.clone())
            .send()
            .await
            .map_err(|e| map_sdk(e, Effect::Read, table))?;
        let Some(desc) = r.stream_description() else {
            break;
        };
        for s in desc.shards() {
            let Some(id) = s.shard_id() else { continue };
            out.insert(
                id.to_string(),
                ShardInfo {
                    parent: s.parent_shard_id().map(str::to_string),
                    closed: s
                        .sequence_number_range()
                        .and_then(|r| r.ending_sequence_number())
                        .is_some(),
                },
            );
        }
        match desc.last_evaluated_shard_id() {
            Some(last) if Some(last) != start.as_deref() => start = Some(last.to_string()),
            _ => break,
        }
    }
    Ok(out)
}

/// Up to `limit` changes after `cursor` from the stream `arn` (see the module docs).
pub async fn read(
    client: &Client,
    arn: &str,
    table: &str,
    cursor: &FeedCursor,
    limit: usize,
) -> Result<FeedBatch, StoreError> {
    let limit = limit.max(1);
    let listed = shards(client, arn, table).await?;
    let mut next = cursor.clone();
    next.retain(|s| listed.contains_key(s));
    let mut changes = Vec::new();
    // Parents first: a pass reads every shard whose parent is finished; a shard finished in
    // this pass lets its children be read in the next one.
    let mut visited = std::collections::BTreeSet::new();
    let mut progressed = true;
    while progressed && changes.len() < limit {
        progressed = false;
        for (id, info) in &listed {
            if next.done(id) || changes.len() >= limit || visited.contains(id) {
                continue;
            }
            let parent_done = match &info.parent {
                None => true,
                Some(p) => !listed.contains_key(p) || next.done(p),
            };
            if !parent_done {
                continue;
            }
            visited.insert(id.clone());
            let (kind, after) = match next.last(id) {
                Some(seq) => (
                    ShardIteratorType::AfterSequenceNumber,
                    Some(seq.to_string()),
                ),
                None => (ShardIteratorType::TrimHorizon, None),
            };
            let it = client
                .get_shard_iterator()
                .stream_arn(arn)
                .shard_id(id)
                .shard_iterator_type(kind)
                .set_sequence_number(after)
                .send()
                .await
                .map_err(|e| map_sdk(e, Effect::Read, table))?;
            let mut iter = it.shard_iterator().map(str::to_string);
            let mut empty = 0;
            while let Some(i) = iter.take() {
                let want = i32::try_from(limit - changes.len())
                    .unwrap_or(1000)
                    .clamp(1, 1000);
                let page = client
                    .get_records()
                    .shard_iterator(i)
                    .limit(want)
                    .send()
                    .await
                    .map_err(|e| map_sdk(e, Effect::Read, table))?;
                let records = page.records();
                for r in records {
                    let c = change(id, r)?;
                    next.advance(&c.position);
                    changes.push(c);
                }
                iter = page.next_shard_iterator().map(str::to_string);
                if iter.is_none() {
                    // A closed shard read to its end.
                    debug_assert!(info.closed || records.is_empty());
                    next.finish(id);
                    progressed = true;
                    break;
                }
                if records.is_empty() {
                    empty += 1;
                    if empty >= EMPTY_PAGES {
                        break;
                    }
                } else {
                    empty = 0;
                }
                if changes.len() >= limit {
                    break;
                }
            }
        }
    }
    Ok(FeedBatch {
        changes,
        cursor: next,
    })
}
