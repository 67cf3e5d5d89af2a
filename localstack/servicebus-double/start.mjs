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
//	                      "enablePartitioning":false,"maxBatchBytes":0}
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
//
// What it does NOT model: authentication and token validity (any token is
// accepted); sessions (SessionId is stored and returned as group_id, but no
// session locks, no AcceptNextSession, no ordering guarantee per session);
// partitions themselves (one store, no per-partition order or outage), the
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
    },
    seq: 0,
    avail: [],
    locks: new Map(),
    seen: new Map(),
    dead: [],
    consumers: new Set(),
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

function requeue(ent, msg) {
  msg.failures += 1;
  if (msg.failures >= ent.cfg.maxDeliveryCount) {
    deadLetter(ent, msg, "MaxDeliveryCountExceeded", `delivered ${msg.failures} times`);
    return;
  }
  const i = ent.avail.findIndex((m) => m.seq > msg.seq);
  if (i < 0) ent.avail.push(msg);
  else ent.avail.splice(i, 0, msg);
  pump(ent);
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

function pump(ent) {
  if (ent.deleted) return;
  debug("pump", ent.name, ent.avail.length, ent.consumers.size, [...ent.consumers].map((s) => `${s.is_open()}/${s.sendable()}`).join(","));
  for (const sender of ent.consumers) {
    while (ent.avail.length > 0 && sender.is_open() && sender.sendable()) {
      const msg = ent.avail.shift();
      const tag = crypto.randomBytes(16);
      const key = tokenKey(tag);
      const lockedUntil = Date.now() + ent.cfg.lockMs;
      const lock = { msg, lockedUntil, timer: undefined };
      lock.timer = setTimeout(() => {
        if (ent.locks.get(key) === lock) {
          ent.locks.delete(key);
          requeue(ent, msg);
        }
      }, ent.cfg.lockMs);
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
      d.entity = ent;
      d.lockKey = key;
    }
  }
}

function lockLost(key) {
  return {
    condition: "com.microsoft:message-lock-lost",
    description: `The lock supplied is invalid. Either the lock expired, or the message has already been removed from the queue. Lock token ${key}`,
  };
}

// settle answers a client's disposition: with rcv-settle-mode second the
// client waits for the broker to settle, so every outcome is settled here.
function settle(ctx) {
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
  const lock = ent.locks.get(d.lockKey);
  if (!lock || lock.lockedUntil < Date.now()) {
    d.update(true, amqpMessage.rejected({ error: lockLost(d.lockKey) }).described());
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
  s.entity = ent;
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
for (const ev of ["sender_close", "sender_error"]) {
  container.on(ev, (ctx) => {
    const ent = ctx.sender.entity;
    if (ent) ent.consumers.delete(ctx.sender);
  });
}
container.on("connection_close", () => {});
container.on("disconnected", (ctx) => {
  for (const ent of entities.values()) {
    for (const s of ent.consumers) if (s.connection === ctx.connection) ent.consumers.delete(s);
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
