// A protocol-level test double of Azure Service Bus for dedupq's
// adapters/servicebus tests: a small AMQP 1.0 broker built on the npm
// package rhea, which the real azservicebus SDK talks to through a
// connection string with UseDevelopmentEmulator=true (plain AMQP, no TLS).
//
// It listens on DOUBLE_PORT (0, the default, picks a free port) and prints
// one line "servicebus-double listening on port N control port M" once it
// accepts connections; it stops when its standard input closes, so a test
// process that dies cannot leave it running.
//
// Entities are created over HTTP on the control port (or at start, from
// DOUBLE_ENTITIES, see below), never implicitly:
//
//	PUT /entities/NAME  {"duplicateDetectionMs":600000,"requiresDuplicateDetection":true,
//	                      "lockMs":1000,"maxDeliveryCount":5,"maxMessageBytes":262144,
//	                      "enablePartitioning":false,"maxBatchBytes":0,"requiresSession":false}
//	GET /entities/NAME/deadletters → [{"messageId":…,"reason":…,"description":…}]
//	DELETE /entities/NAME
//
// DOUBLE_DEBUG=1 in the environment makes it report its own errors and
// each store and delivery on stderr (the Go launcher then shows them).
//
// What it models (what the SDK needs, see /work/shared/TESTING.md):
//   - SASL ANONYMOUS; settle modes echoed on attach; CBS put-token on $cbs
//     answered (status-code 202 as an AMQP int) on the link whose target is
//     the request's reply_to, correlation_id = the request's message_id;
//     attaches to NAME/$management, whose com.microsoft:renew-lock requests
//     it answers (status-code 200, expirations as an array of timestamps).
//   - Sends, single and batched (message format 0x80013700, one data section
//     per encoded message); MaxMessageBytes as the receiving link's
//     max-message-size (the SDK sizes MessageBatch by it) and a rejection
//     (amqp:link:message-size-exceeded) of a larger message.
//   - Duplicate detection on MessageId within the entity's window, counted
//     from the first send: a duplicate is accepted and dropped. On a
//     partitioned entity the key is the partition key with the MessageId
//     (https://learn.microsoft.com/azure/service-bus-messaging/duplicate-detection:
//     "If partitioning is enabled, MessageId+PartitionKey is used to
//     determine uniqueness"), so one MessageId under two keys is stored twice.
//   - Partitioned entities (enablePartitioning) refuse a batch transfer of
//     two or more messages whose SessionId or PartitionKey differ
//     (the Service Bus SDK troubleshooting guide, "Cannot send batch with
//     multiple partition keys": https://aka.ms/azsdk/net/servicebus/exceptions/troubleshoot,
//     Azure/azure-sdk-for-net sdk/servicebus/Azure.Messaging.ServiceBus/TROUBLESHOOTING.md), and,
//     with duplicate detection on as well, any batch of two or more whose
//     SessionId, PartitionKey or MessageId differ, as the service does
//     (amqp:not-allowed "Batching brokered messages with distinct
//     SessionId, PartitionKey, or MessageId is not supported for an entity
//     with partitioning and duplicate detection enabled"; the service team
//     in Azure/azure-sdk-for-python#36333: do not batch there). A message
//     with no key of its own counts its MessageId as the key where
//     duplicate detection is on (the MessageId "serves as the partition
//     key"), else the empty key.
//   - Premium's batch limit (maxBatchBytes): the link advertises it as the
//     vendor property com.microsoft:max-message-batch-size, which the SDK
//     sizes MessageBatch by (azservicebus 1.11.0 CHANGELOG: on Premium
//     large-message entities "max-message-size can be up to 100 MB but the
//     batch limit is 1 MB"), and a batch
//     transfer larger than it is refused (amqp:link:message-size-exceeded);
//     a single message is bounded by maxMessageBytes only.
//   - The property quotas of
//     https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas
//     ("Message property size for a queue, topic, or subscription entity":
//     32 KB for each property, 64 KB for the whole header, user and system
//     properties together): a message over either refuses its whole
//     transfer with amqp:link:message-size-exceeded and a serialization
//     description (the documented .NET exception is SerializationException;
//     the real AMQP condition for a single property over 32 KB is not
//     documented). A property counts its name and its value as UTF-8; the
//     header counts every application property, MessageId, SessionId,
//     PartitionKey, subject, correlation and reply-to IDs, content type.
//   - Peek-lock delivery: a random 16-byte delivery tag is the lock token;
//     annotations x-opt-sequence-number, x-opt-enqueued-time,
//     x-opt-locked-until; header delivery_count (the SDK adds 1).
//   - Dispositions settled explicitly by the broker: accepted = complete,
//     modified = abandon (delivery count + 1, redelivered at once), rejected
//     with com.microsoft:dead-letter = dead-letter with reason; a settlement
//     or renewal whose lock has expired is refused with
//     com.microsoft:message-lock-lost.
//   - Lock expiry → redelivery with delivery count + 1; once the count
//     reaches MaxDeliveryCount the message is dead-lettered
//     (MaxDeliveryCountExceeded).
//   - A link gets no more messages than its credit: rhea counts a delivery
//     against the credit only when it writes it, so the double counts the
//     ones it queued itself (a link with one credit is handed one message,
//     not every available one, each locked while it waits in rhea's queue).
//   - Sessions (requiresSession), as the SDK's SessionReceiver drives them
//     (azservicebus session_receiver.go, internal/mgmt.go):
//       - a message without SessionId is refused (amqp:not-allowed, the
//         service's text); a receiver attach with the source filter
//         com.microsoft:session-filter (described 0x137000000C) on an
//         entity without sessions, or without it on a session entity, is
//         refused with the service's text (amqp:not-allowed: the real
//         condition is not documented);
//       - a filter with a SessionId locks that session, or is refused with
//         com.microsoft:session-cannot-be-locked while another link holds
//         it; a null filter accepts the next available session: the
//         unlocked one whose oldest available message is oldest, or,
//         when none has one, waits up to the link property
//         com.microsoft:timeout (ms; 60 s without) and is refused with
//         com.microsoft:timeout. A refusal is an attach with no source
//         followed by a detach with the error, as the service sends it;
//       - the attach answer names the session in the source filter and
//         its lock's expiry in the link property
//         com.microsoft:locked-until-utc (.NET ticks), which the SDK reads;
//       - the session lock (LockDuration) covers every message received in
//         the session (x-opt-locked-until is the session's); a session
//         receiver gets only its session's messages, in sequence order,
//         later ones while earlier ones are unsettled; an abandon puts the
//         message back at its place (delivery count + 1), so it comes
//         again before the later ones;
//       - com.microsoft:renew-session-lock on the management link, from
//         the link that holds the session (associated-link-name), renews
//         the lock by LockDuration (expiration in the answer); otherwise,
//         and for a settlement after the lock was lost, the answer is 410
//         / com.microsoft:session-lock-lost;
//       - when the lock expires the link is detached with
//         com.microsoft:session-lock-lost; when the link closes (or its
//         connection drops) the session is released: either way its
//         locked messages go back in order, each counted as a delivery,
//         and the session can be accepted again at once.
//   - com.microsoft:update-disposition on the management link (the SDK's
//     fallback when the link a message came on is gone) settles a message
//     still locked, and answers 410 for a session's message, whose lock
//     went with its link.
//
// What it does NOT model: authentication and token validity (any token is
// accepted); session state (get/set-session-state), listing sessions, and
// the real broker's grace before a released session can be accepted again;
// whether the service counts a delivery for a session message given back
// on a link's close (the double does); partitions themselves (one store, no per-partition order or outage), the
// rule that PartitionKey must equal SessionId; topics and subscriptions
// (only queues); the management API (HTTP/ATOM: the tests use the
// adapter's seam); deferral, scheduling, peek, receive-and-delete mode,
// message TTL and expiry, auto-forwarding, transactions; the dead-letter
// sub-queue as an AMQP entity (read it over HTTP instead); quotas,
// throttling, and any error the real service gives that is not listed
// above.
import rhea from "rhea";
import http from "node:http";
import crypto from "node:crypto";

const { types, message: amqpMessage } = rhea;
const BATCH_FORMAT = 0x80013700;

/** Entities by lower-cased name (Service Bus names are case-insensitive). */
const entities = new Map();
/** Sender links by the address the client receives responses on. */
const replyLinks = new Map();

function newEntity(name, cfg) {
  return {
    name,
    cfg: {
      duplicateDetectionMs: cfg.duplicateDetectionMs ?? 600000,
      requiresDuplicateDetection: cfg.requiresDuplicateDetection ?? true,
      lockMs: cfg.lockMs ?? 60000,
      maxDeliveryCount: cfg.maxDeliveryCount ?? 10,
      maxMessageBytes: cfg.maxMessageBytes ?? 256 * 1024,
      enablePartitioning: cfg.enablePartitioning ?? false,
      maxBatchBytes: cfg.maxBatchBytes ?? 0,
      requiresSession: cfg.requiresSession ?? false,
    },
    seq: 0,
    avail: [],
    locks: new Map(),
    seen: new Map(),
    dead: [],
    consumers: new Set(),
    // Session entities: sessions by SessionId, and the accept-next-session
    // links waiting for one to become available, oldest first.
    sessions: new Map(),
    waiting: [],
    deleted: false,
  };
}

function lookup(address) {
  if (typeof address !== "string") return undefined;
  return entities.get(address.toLowerCase());
}

// The SDK turns a delivery tag into a lock token by swapping the first
// three groups of bytes (.NET GUID order); keep locks under the token form.
function tokenKey(tag) {
  const t = Buffer.from(tag);
  [t[0], t[3]] = [t[3], t[0]];
  [t[1], t[2]] = [t[2], t[1]];
  [t[4], t[5]] = [t[5], t[4]];
  [t[6], t[7]] = [t[7], t[6]];
  return t.toString("hex");
}

function bodyBytes(m) {
  const b = m.body;
  if (b === undefined || b === null) return Buffer.alloc(0);
  if (Buffer.isBuffer(b)) return b;
  if (b.typecode === 0x75) {
    return b.multiple ? Buffer.concat(b.content) : Buffer.from(b.content ?? []);
  }
  return Buffer.from(typeof b === "string" ? b : JSON.stringify(b));
}

const debug = (...a) => {
  if (process.env.DOUBLE_DEBUG) process.stderr.write(`servicebus-double: ${a.join(" ")}\n`);
};

// partitionKeyOf is the key that places m on a partitioned entity: its
// SessionId, which overrides PartitionKey, else its PartitionKey, else,
// with duplicate detection on, its MessageId; "" when it has none.
function partitionKeyOf(ent, m) {
  const a = m.message_annotations || {};
  const k = m.group_id ?? a["x-opt-partition-key"];
  if (k !== undefined && k !== null) return String(k);
  if (ent.cfg.requiresDuplicateDetection && m.message_id !== undefined) return String(m.message_id);
  return "";
}

// batchRefusal is why a partitioned entity refuses msgs as one transfer,
// or undefined when it takes them.
function batchRefusal(ent, msgs) {
  if (!ent.cfg.enablePartitioning || msgs.length < 2) return undefined;
  const distinct = (f) => new Set(msgs.map(f)).size > 1;
  const session = (m) => String(m.group_id ?? "");
  const pkey = (m) => String((m.message_annotations || {})["x-opt-partition-key"] ?? "");
  if (ent.cfg.requiresDuplicateDetection) {
    if (distinct(session) || distinct(pkey) || distinct((m) => String(m.message_id ?? ""))) {
      return "Batching brokered messages with distinct SessionId, PartitionKey, or MessageId  is not supported for an entity with partitioning and duplicate detection enabled.";
    }
    return undefined;
  }
  if (distinct((m) => partitionKeyOf(ent, m))) {
    return "Batching brokered messages with distinct SessionId or PartitionKey is not supported for an entity with partitioning enabled.";
  }
  return undefined;
}

const MAX_PROPERTY_BYTES = 32 * 1024;
const MAX_HEADER_BYTES = 64 * 1024;

const utf8 = (v) => (v === undefined || v === null ? 0 : Buffer.byteLength(typeof v === "string" ? v : String(v)));

// headerRefusal is why the broker cannot serialize m's header (the
// property quotas), or undefined.
function headerRefusal(m) {
  let total = 0;
  for (const [k, v] of Object.entries(m.application_properties || {})) {
    const n = utf8(k) + utf8(v);
    if (n > MAX_PROPERTY_BYTES) {
      return `A serialization error occurred while processing the message header: property '${k}' is ${n} bytes; the size quota for a property (${MAX_PROPERTY_BYTES}) has been exceeded.`;
    }
    total += n;
  }
  const a = m.message_annotations || {};
  for (const v of [m.message_id, m.group_id, a["x-opt-partition-key"], m.subject, m.correlation_id, m.reply_to, m.content_type, m.to]) {
    total += utf8(v);
  }
  if (total > MAX_HEADER_BYTES) {
    return `A serialization error occurred while processing the message header stream. The size quota for this stream (${MAX_HEADER_BYTES}) has been exceeded.`;
  }
  return undefined;
}

function store(ent, m) {
  const now = Date.now();
  debug("store", ent.name, m.message_id);
  const id = m.message_id === undefined ? undefined : String(m.message_id);
  if (ent.cfg.requiresDuplicateDetection && id !== undefined) {
    // Partitioned: the same MessageId under another key is a new message.
    const key = ent.cfg.enablePartitioning ? `${partitionKeyOf(ent, m)}\u0000${id}` : id;
    const until = ent.seen.get(key);
    if (until !== undefined && until > now) return; // dropped as a duplicate
    ent.seen.set(key, now + ent.cfg.duplicateDetectionMs);
  }
  ent.seq += 1;
  ent.avail.push({
    seq: ent.seq,
    enqueued: new Date(now),
    messageId: id,
    groupId: m.group_id,
    appProps: m.application_properties,
    annotations: m.message_annotations ?? {},
    body: bodyBytes(m),
    failures: 0,
  });
  pump(ent);
}

// requeue makes msg available again at its place in sequence order (so
// in its session's order), counting the delivery it had; hold skips the
// pump, for a caller that puts back several messages before any may go.
function requeue(ent, msg, hold) {
  msg.failures += 1;
  if (msg.failures >= ent.cfg.maxDeliveryCount) {
    deadLetter(ent, msg, "MaxDeliveryCountExceeded", `delivered ${msg.failures} times`);
  } else {
    const i = ent.avail.findIndex((m) => m.seq > msg.seq);
    if (i < 0) ent.avail.push(msg);
    else ent.avail.splice(i, 0, msg);
  }
  if (!hold) pump(ent);
}

function deadLetter(ent, msg, reason, description) {
  ent.dead.push({ messageId: msg.messageId, reason, description });
}

function unlock(ent, key) {
  const lock = ent.locks.get(key);
  if (!lock) return undefined;
  clearTimeout(lock.timer);
  ent.locks.delete(key);
  return lock.msg;
}

// room is how many more messages the client's credit takes on sender:
// rhea counts a delivery against the credit only once it writes the
// transfer, after this tick, so sendable() alone would let one pump hand
// (and lock) every available message to a link with one credit.
function room(sender) {
  if (!sender.is_open() || !sender.session.outgoing.available()) return 0;
  return sender.credit - ((sender.sbSent ?? 0) - sender.delivery_count);
}

function pump(ent) {
  if (ent.deleted) return;
  debug("pump", ent.name, ent.avail.length, ent.consumers.size, [...ent.consumers].map((s) => `${s.is_open()}/${s.sendable()}`).join(","));
  for (const sender of ent.consumers) {
    // A session receiver gets the messages of its session only, and
    // only while it holds the session's lock.
    const ses = sender.sbSession;
    if (ent.cfg.requiresSession && !ses) continue;
    while (room(sender) > 0) {
      const i = ses ? ent.avail.findIndex((m) => m.groupId === ses.id) : ent.avail.length > 0 ? 0 : -1;
      if (i < 0) break;
      const [msg] = ent.avail.splice(i, 1);
      debug("deliver", msg.messageId, ses ? ses.id : "", ent.avail.map((m) => m.messageId).join(","));
      const tag = crypto.randomBytes(16);
      const key = tokenKey(tag);
      let lock;
      let lockedUntil;
      if (ses) {
        // A session message is locked by its session's lock: it has no
        // timer of its own, and goes back when the session is lost.
        lockedUntil = ses.lockedUntil;
        lock = { msg, session: ses, link: sender };
      } else {
        lockedUntil = Date.now() + ent.cfg.lockMs;
        lock = { msg, lockedUntil, timer: undefined };
        lock.timer = setTimeout(() => {
          if (ent.locks.get(key) === lock) {
            ent.locks.delete(key);
            requeue(ent, msg);
          }
        }, ent.cfg.lockMs);
      }
      ent.locks.set(key, lock);
      const out = {
        message_id: msg.messageId,
        delivery_count: types.wrap_uint(msg.failures),
        application_properties: msg.appProps,
        message_annotations: {
          ...msg.annotations,
          "x-opt-sequence-number": types.wrap_long(msg.seq),
          "x-opt-enqueued-time": msg.enqueued,
          "x-opt-locked-until": new Date(lockedUntil),
        },
        body: amqpMessage.data_section(msg.body),
      };
      if (msg.groupId !== undefined) out.group_id = msg.groupId;
      const d = sender.send(out, tag);
      sender.sbSent = (sender.sbSent ?? 0) + 1;
      d.entity = ent;
      d.lockKey = key;
      d.sbSession = ses;
    }
  }
  assignWaiting(ent);
}

// ---- Sessions ----

const SESSION_FILTER = "com.microsoft:session-filter";
const SESSION_FILTER_CODE = 0x137000000c;
// .NET ticks (100 ns since 0001-01-01) of the Unix epoch: the unit of the
// link property com.microsoft:locked-until-utc.
const EPOCH_TICKS = 621355968000000000n;

function sessionOf(ent, id) {
  let ses = ent.sessions.get(id);
  if (!ses) {
    ses = { id, owner: undefined, lockedUntil: 0, timer: undefined };
    ent.sessions.set(id, ses);
  }
  return ses;
}

function renewSession(ent, ses) {
  clearTimeout(ses.timer);
  ses.lockedUntil = Date.now() + ent.cfg.lockMs;
  ses.timer = setTimeout(() => {
    debug("session lock expired", ent.name, ses.id);
    releaseSession(ent, ses, {
      condition: "com.microsoft:session-lock-lost",
      description: `The session lock has expired on the MessageSession. Accept a new MessageSession. SessionId: ${ses.id}`,
    });
  }, ent.cfg.lockMs);
}

// releaseSession ends the owner's hold of ses (its link closed, or the
// lock expired, which detaches the link with error): the messages it had
// locked go back to the session in sequence order, each counted as a
// delivery, and the session may be accepted again.
function releaseSession(ent, ses, error) {
  clearTimeout(ses.timer);
  const link = ses.owner;
  ses.owner = undefined;
  ses.lockedUntil = 0;
  if (link) link.sbSession = undefined;
  const back = [];
  for (const [key, lock] of ent.locks) {
    if (lock.session === ses) {
      ent.locks.delete(key);
      back.push(lock.msg);
    }
  }
  back.sort((a, b) => a.seq - b.seq);
  for (const msg of back) requeue(ent, msg, true);
  if (error && link && !link.is_closed()) link.close(error);
  pump(ent);
}

// freeSession is the session an accept-next-session gets: the one, not
// locked, whose oldest available message is the oldest.
function freeSession(ent) {
  for (const m of ent.avail) {
    if (m.groupId === undefined) continue;
    const ses = sessionOf(ent, m.groupId);
    if (!ses.owner) return ses;
  }
  return undefined;
}

// grant locks ses to the link and answers the link's attach with the
// session's ID in the source filter and the lock's expiry in the link
// properties, which is how the SDK learns both.
function grant(ent, link, ses) {
  ses.owner = link;
  link.sbSession = ses;
  renewSession(ent, ses);
  const source = link.remote.attach.source || {};
  link.set_source({ address: source.address, filter: { [SESSION_FILTER]: types.wrap_described(ses.id, SESSION_FILTER_CODE) } });
  const ticks = Buffer.alloc(8);
  ticks.writeBigInt64BE(BigInt(ses.lockedUntil) * 10000n + EPOCH_TICKS);
  link.local.attach.properties = { ...(link.local.attach.properties || {}), "com.microsoft:locked-until-utc": types.wrap_long(ticks) };
  link.entity = ent;
  ent.consumers.add(link);
  debug("session granted", ent.name, ses.id);
  if (link.sbDeferred) {
    link.sbDeferred = false;
    link.open();
  }
}

// refuse answers a link's attach with no source, then detaches it with
// error: how Service Bus refuses a receiver (go-amqp then reports the
// detach's error).
function refuse(link, condition, description) {
  debug("refuse", condition, description);
  link.local.attach.source = null;
  if (link.sbDeferred) {
    link.sbDeferred = false;
    link.open();
  }
  link.close({ condition, description });
}

// defer holds back the answer to the link's attach, which rhea has
// queued already, until grant or refuse sends it.
function defer(link) {
  link.state.local_open = false;
  link.state.open_requests = Math.max(0, link.state.open_requests - 1);
  link.sbDeferred = true;
}

function assignWaiting(ent) {
  while (ent.waiting.length > 0) {
    const ses = freeSession(ent);
    if (!ses) return;
    const w = ent.waiting.shift();
    clearTimeout(w.timer);
    if (!w.link.is_remote_open()) continue;
    grant(ent, w.link, ses);
    pump(ent);
  }
}

function unwait(ent, link) {
  const i = ent.waiting.findIndex((w) => w.link === link);
  if (i >= 0) {
    clearTimeout(ent.waiting[i].timer);
    ent.waiting.splice(i, 1);
  }
}

// openSessionLink answers an attach whose source carries the session
// filter: a named session is locked at once, or refused while another
// receiver holds it; a null filter accepts the next available session,
// waiting for one up to the link's com.microsoft:timeout (60 s without).
function openSessionLink(ent, s, value) {
  if (value !== undefined && value !== null) {
    const ses = sessionOf(ent, String(value));
    if (ses.owner && ses.owner !== s) {
      refuse(s, "com.microsoft:session-cannot-be-locked", `The requested session '${ses.id}' cannot be accepted. It may be locked by another receiver.`);
      return;
    }
    grant(ent, s, ses);
    return;
  }
  const ses = freeSession(ent);
  if (ses) {
    grant(ent, s, ses);
    return;
  }
  defer(s);
  const props = s.remote.attach.properties || {};
  const ms = Number(props["com.microsoft:timeout"] ?? 60000);
  const w = { link: s, timer: undefined };
  w.timer = setTimeout(() => {
    unwait(ent, s);
    refuse(s, "com.microsoft:timeout", `The operation did not complete within the allotted timeout of ${ms} ms. No session was available.`);
  }, ms);
  ent.waiting.push(w);
}

function lockLost(key) {
  return {
    condition: "com.microsoft:message-lock-lost",
    description: `The lock supplied is invalid. Either the lock expired, or the message has already been removed from the queue. Lock token ${key}`,
  };
}

function sessionLockLost(ses) {
  return {
    condition: "com.microsoft:session-lock-lost",
    description: `The session lock has expired on the MessageSession. Accept a new MessageSession. SessionId: ${ses ? ses.id : ""}`,
  };
}

// held is the lock under key when it is still valid: a message's own lock
// before its expiry, a session message's while its session is held by the
// link that received it.
function held(ent, key) {
  const lock = ent.locks.get(key);
  if (!lock) return undefined;
  if (lock.session) return lock.session.owner === lock.link && lock.session.lockedUntil >= Date.now() ? lock : undefined;
  return lock.lockedUntil >= Date.now() ? lock : undefined;
}

// settle answers a client's disposition: with rcv-settle-mode second the
// client waits for the broker to settle, so every outcome is settled here.
function settle(ctx) {
  debug("settle", ctx.delivery.remote_state && ctx.delivery.remote_state.constructor.composite_type);
  const d = ctx.delivery;
  if (d.handled) return;
  d.handled = true;
  const ent = d.entity;
  const state = d.remote_state;
  const kind = state && state.constructor.composite_type;
  if (!ent) {
    d.update(true);
    return;
  }
  const lock = held(ent, d.lockKey);
  if (!lock) {
    d.update(true, amqpMessage.rejected({ error: d.sbSession ? sessionLockLost(d.sbSession) : lockLost(d.lockKey) }).described());
    return;
  }
  const msg = unlock(ent, d.lockKey);
  switch (kind) {
    case "accepted":
      break;
    case "rejected": {
      const info = (state.error && state.error.info) || {};
      deadLetter(ent, msg, String(info.DeadLetterReason ?? ""), String(info.DeadLetterErrorDescription ?? ""));
      break;
    }
    case "modified":
      if (state.undeliverable_here) {
        // Deferral is not modelled: put the lock back and refuse.
        ent.locks.set(d.lockKey, lock);
        d.update(true, amqpMessage.rejected({ error: { condition: "amqp:not-implemented", description: "defer is not modelled by the double" } }).described());
        return;
      }
      requeue(ent, msg);
      break;
    default: // released
      requeue(ent, msg);
  }
  // The outcome goes back re-encoded: rhea keeps the peer's state
  // unwrapped, which it would encode as an empty map.
  const outcomes = {
    accepted: () => amqpMessage.accepted(),
    // Service Bus answers a dead-letter with a rejected outcome that
    // carries no error; go-amqp reports an error in it as a failure.
    rejected: () => amqpMessage.rejected(),
    modified: () => amqpMessage.modified({ delivery_failed: state.delivery_failed, undeliverable_here: state.undeliverable_here }),
    released: () => amqpMessage.released(),
  };
  d.update(true, (outcomes[kind] || outcomes.released)().described());
}

function reply(req, status, description, body) {
  const sender = replyLinks.get(req.reply_to);
  if (!sender) return;
  const res = {
    correlation_id: req.message_id,
    application_properties: {
      "status-code": types.wrap_int(status),
      "status-description": description,
      statusCode: types.wrap_int(status),
      statusDescription: description,
    },
  };
  if (body !== undefined) res.body = body;
  sender.send(res);
}

function management(ent, req) {
  const op = req.application_properties && req.application_properties.operation;
  if (op === "com.microsoft:renew-session-lock") {
    renewSessionLock(ent, req);
    return;
  }
  if (op === "com.microsoft:update-disposition") {
    updateDisposition(ent, req);
    return;
  }
  if (op !== "com.microsoft:renew-lock") {
    reply(req, 501, `operation ${op} is not modelled by the double`);
    return;
  }
  const tokens = (req.body && req.body["lock-tokens"]) || [];
  const expirations = [];
  for (const t of tokens) {
    const key = Buffer.isBuffer(t) ? t.toString("hex") : String(t).replaceAll("-", "");
    const lock = ent.locks.get(key);
    if (!lock || lock.lockedUntil < Date.now()) {
      reply(req, 410, lockLost(key).description);
      return;
    }
    clearTimeout(lock.timer);
    lock.lockedUntil = Date.now() + ent.cfg.lockMs;
    lock.timer = setTimeout(() => {
      if (ent.locks.get(key) === lock) {
        ent.locks.delete(key);
        requeue(ent, lock.msg);
      }
    }, ent.cfg.lockMs);
    expirations.push(lock.lockedUntil);
  }
  reply(req, 200, "OK", { expirations: types.wrap_array(expirations, 0x83) });
}

// renewSessionLock answers com.microsoft:renew-session-lock: the session
// named in the body, held by the link the request names
// (associated-link-name), is locked for another LockDuration; otherwise
// 410, the status the SDK reads as a lost lock.
function renewSessionLock(ent, req) {
  const id = req.body && req.body["session-id"];
  const linkName = req.application_properties["associated-link-name"];
  const ses = ent.sessions.get(String(id));
  if (!ses || !ses.owner || ses.lockedUntil < Date.now() || (linkName !== undefined && ses.owner.name !== linkName)) {
    replyError(req, 410, sessionLockLost(ses ?? { id }));
    return;
  }
  renewSession(ent, ses);
  reply(req, 200, "OK", { expiration: types.wrap_timestamp(ses.lockedUntil) });
}

// updateDisposition answers com.microsoft:update-disposition, which the
// SDK sends when the link a message came on is gone: a message still
// locked (only a message without a session can be: a session's messages
// go back when its link closes) is settled; any other answers 410.
function updateDisposition(ent, req) {
  const body = req.body || {};
  const status = body["disposition-status"];
  for (const t of body["lock-tokens"] || []) {
    const key = Buffer.isBuffer(t) ? t.toString("hex") : String(t).replaceAll("-", "");
    const lock = held(ent, key);
    if (!lock || lock.session) {
      replyError(req, 410, lockLost(key));
      return;
    }
  }
  for (const t of body["lock-tokens"] || []) {
    const key = Buffer.isBuffer(t) ? t.toString("hex") : String(t).replaceAll("-", "");
    const msg = unlock(ent, key);
    if (status === "suspended") deadLetter(ent, msg, String(body["deadletter-reason"] ?? ""), String(body["deadletter-description"] ?? ""));
    else if (status !== "completed") requeue(ent, msg);
  }
  reply(req, 200, "OK");
}

function replyError(req, status, error) {
  const sender = replyLinks.get(req.reply_to);
  if (!sender) return;
  sender.send({
    correlation_id: req.message_id,
    application_properties: {
      "status-code": types.wrap_int(status),
      "status-description": error.description,
      statusCode: types.wrap_int(status),
      statusDescription: error.description,
      "error-condition": types.wrap_symbol(error.condition),
    },
  });
}

const container = rhea.create_container({ id: "servicebus-double", autoaccept: false });
container.sasl_server_mechanisms.enable_anonymous();

function echoModes(link) {
  const r = link.remote.attach;
  link.local.attach.snd_settle_mode = r.snd_settle_mode;
  link.local.attach.rcv_settle_mode = r.rcv_settle_mode;
}

container.on("sender_open", (ctx) => {
  const s = ctx.sender;
  echoModes(s);
  const source = s.remote.attach.source || {};
  const target = s.remote.attach.target || {};
  // Echo the addresses only: echoing the whole unwrapped terminus makes
  // rhea encode fields the peer's decoder refuses.
  s.set_source({ address: source.address });
  s.set_target({ address: target.address });
  const addr = source.address;
  if (addr === "$cbs" || (typeof addr === "string" && addr.toLowerCase().endsWith("/$management"))) {
    if (target.address) replyLinks.set(target.address, s);
    return;
  }
  const ent = lookup(addr);
  if (!ent) {
    s.close({ condition: "amqp:not-found", description: `The messaging entity '${addr}' could not be found.` });
    return;
  }
  const filter = source.filter || {};
  const sessionful = Object.prototype.hasOwnProperty.call(filter, SESSION_FILTER);
  if (ent.cfg.requiresSession !== sessionful) {
    // The service's words (InvalidOperationException); the AMQP
    // condition it sends is not documented.
    refuse(
      s,
      "amqp:not-allowed",
      ent.cfg.requiresSession
        ? "It is not possible for an entity that requires sessions to create a non-sessionful message receiver."
        : "It is not possible for an entity that does not require sessions to create a sessionful message receiver.",
    );
    return;
  }
  s.entity = ent;
  if (sessionful) {
    const v = filter[SESSION_FILTER];
    openSessionLink(ent, s, v && typeof v === "object" && "value" in v ? v.value : v);
    return;
  }
  ent.consumers.add(s);
});

container.on("receiver_open", (ctx) => {
  const r = ctx.receiver;
  echoModes(r);
  const target = r.remote.attach.target || {};
  r.set_source({ address: (r.remote.attach.source || {}).address });
  r.set_target({ address: target.address });
  const addr = target.address;
  if (addr === "$cbs") return;
  if (typeof addr === "string" && addr.toLowerCase().endsWith("/$management")) {
    r.mgmtEntity = lookup(addr.slice(0, -"/$management".length));
    if (!r.mgmtEntity) r.close({ condition: "amqp:not-found", description: `The messaging entity '${addr}' could not be found.` });
    return;
  }
  const ent = lookup(addr);
  if (!ent) {
    r.close({ condition: "amqp:not-found", description: `The messaging entity '${addr}' could not be found.` });
    return;
  }
  r.entity = ent;
  r.local.attach.max_message_size = ent.cfg.maxMessageBytes;
  if (ent.cfg.maxBatchBytes > 0) {
    // What Premium's links say (and what azservicebus reads to size a
    // MessageBatch): batches are bounded below max-message-size.
    r.local.attach.properties = { "com.microsoft:max-message-batch-size": types.wrap_ulong(ent.cfg.maxBatchBytes) };
  }
});

container.on("message", (ctx) => {
  const r = ctx.receiver;
  const d = ctx.delivery;
  const m = ctx.message;
  const addr = (r.remote.attach.target || {}).address;
  if (addr === "$cbs") {
    d.accept();
    const op = m.application_properties && m.application_properties.operation;
    reply(m, op === "put-token" ? 202 : 400, op === "put-token" ? "Accepted" : `unknown operation ${op}`);
    return;
  }
  if (r.mgmtEntity) {
    d.accept();
    management(r.mgmtEntity, m);
    return;
  }
  const ent = r.entity;
  if (!ent || ent.deleted) {
    d.reject({ condition: "amqp:not-found", description: `The messaging entity '${addr}' could not be found.` });
    return;
  }
  let msgs = [m];
  if (d.format === BATCH_FORMAT) {
    // rhea hands over a message of another format undecoded.
    const outer = Buffer.isBuffer(m) ? amqpMessage.decode(m) : m;
    const b = outer.body;
    const parts = b && b.typecode === 0x75 ? (b.multiple ? b.content : [b.content]) : [];
    const bytes = Buffer.isBuffer(m) ? m.length : parts.reduce((n, p) => n + p.length, 0);
    if (ent.cfg.maxBatchBytes > 0 && bytes > ent.cfg.maxBatchBytes) {
      d.reject({
        condition: "amqp:link:message-size-exceeded",
        description: `The message (size:${bytes} bytes) is larger than is currently allowed (${ent.cfg.maxBatchBytes} bytes).`,
      });
      return;
    }
    msgs = parts.map((p) => amqpMessage.decode(Buffer.from(p)));
  }
  if (ent.cfg.requiresSession && msgs.some((one) => one.group_id === undefined || one.group_id === null)) {
    d.reject({
      condition: "amqp:not-allowed",
      description:
        "The SessionId was not set on a message, and it cannot be sent to the entity. Entities that have session support enabled can only receive messages that have the SessionId set to a valid value.",
    });
    return;
  }
  const refusal = batchRefusal(ent, msgs);
  if (refusal) {
    d.reject({ condition: "amqp:not-allowed", description: refusal });
    return;
  }
  for (const one of msgs) {
    const why = headerRefusal(one);
    if (why) {
      d.reject({ condition: "amqp:link:message-size-exceeded", description: why });
      return;
    }
  }
  for (const one of msgs) {
    const size = bodyBytes(one).length;
    if (size > ent.cfg.maxMessageBytes) {
      d.reject({
        condition: "amqp:link:message-size-exceeded",
        description: `The received message (size ${size} bytes) exceeds the limit (${ent.cfg.maxMessageBytes} bytes) currently allowed on the link.`,
      });
      return;
    }
  }
  for (const one of msgs) store(ent, one);
  d.accept();
});

container.on("sendable", (ctx) => {
  if (ctx.sender.entity) pump(ctx.sender.entity);
});
for (const ev of ["accepted", "rejected", "released"]) container.on(ev, settle);
// gone forgets a client's receiver link: a session it held is released,
// its locked messages back in the session; an accept it waited on ends.
function gone(s) {
  const ent = s.entity;
  if (!ent) return;
  ent.consumers.delete(s);
  unwait(ent, s);
  if (s.sbDeferred) {
    // The client gave up waiting for a session (its context ended):
    // answer the attach it never got before rhea answers its detach.
    s.sbDeferred = false;
    s.local.attach.source = null;
    if (s.session.is_open()) s.open();
  }
  if (s.sbSession && s.sbSession.owner === s) releaseSession(ent, s.sbSession);
}
for (const ev of ["sender_close", "sender_error"]) {
  container.on(ev, (ctx) => gone(ctx.sender));
}
container.on("connection_close", () => {});
container.on("session_close", (ctx) => {
  for (const ent of entities.values()) {
    for (const s of [...ent.consumers, ...ent.waiting.map((w) => w.link)]) if (s.session === ctx.session) gone(s);
  }
});
container.on("disconnected", (ctx) => {
  for (const ent of entities.values()) {
    for (const s of [...ent.consumers, ...ent.waiting.map((w) => w.link)]) if (s.connection === ctx.connection) gone(s);
  }
  for (const [k, s] of replyLinks) if (s.connection === ctx.connection) replyLinks.delete(k);
});
// rhea passes the error itself, not a context, to "error" listeners.
container.on("error", (e) => {
  if (process.env.DOUBLE_DEBUG) process.stderr.write(`servicebus-double: ${(e && e.stack) || e}\n`);
});

const control = http.createServer((req, res) => {
  const m = /^\/entities\/([^/]+)(\/deadletters)?$/.exec(req.url ?? "");
  const send = (code, obj) => {
    res.writeHead(code, { "content-type": "application/json" });
    res.end(JSON.stringify(obj ?? {}));
  };
  if (!m) return send(404, { error: "unknown path" });
  const name = decodeURIComponent(m[1]);
  let body = "";
  req.on("data", (c) => (body += c));
  req.on("end", () => {
    if (req.method === "PUT" && !m[2]) {
      let cfg;
      try {
        cfg = body ? JSON.parse(body) : {};
      } catch (e) {
        return send(400, { error: String(e) });
      }
      entities.set(name.toLowerCase(), newEntity(name, cfg));
      return send(200, entities.get(name.toLowerCase()).cfg);
    }
    const ent = entities.get(name.toLowerCase());
    if (!ent) return send(404, { error: `no entity ${name}` });
    if (req.method === "GET" && m[2]) return send(200, ent.dead);
    if (req.method === "DELETE" && !m[2]) {
      ent.deleted = true;
      for (const key of [...ent.locks.keys()]) unlock(ent, key);
      for (const ses of ent.sessions.values()) clearTimeout(ses.timer);
      for (const w of ent.waiting) clearTimeout(w.timer);
      entities.delete(name.toLowerCase());
      return send(200, {});
    }
    return send(405, { error: "method not allowed" });
  });
});

// DOUBLE_ENTITIES, a JSON object {"NAME": {…the PUT body…}}, creates
// entities before the double listens: it keeps everything in memory, and a
// test that restarts it must find its queues again, as Service Bus never
// loses an entity to a restart.
for (const [name, cfg] of Object.entries(JSON.parse(process.env.DOUBLE_ENTITIES || "{}"))) {
  entities.set(name.toLowerCase(), newEntity(name, cfg));
}

const port = Number.parseInt(process.env.DOUBLE_PORT ?? "0", 10);
const server = container.listen({ port, host: "127.0.0.1" });
server.on("listening", () => {
  control.listen(0, "127.0.0.1", () => {
    process.stdout.write(`servicebus-double listening on port ${server.address().port} control port ${control.address().port}\n`);
  });
});

function stop() {
  process.exit(0);
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
process.stdin.on("end", stop);
process.stdin.on("error", stop);
process.stdin.resume();
