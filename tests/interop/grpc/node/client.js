// Drive the official RocketMQ 5.x Node.js client (rocketmq-client-nodejs 1.0.8) against a gRPC endpoint.
// Prints one JSON object per stdout line with an "event" key (the same events as ../clients/py5.py).
//   node client.js <produce|transaction|recall|simple|push> --endpoints h:p --topic T [options]
'use strict';

const {
  Producer, SimpleConsumer, PushConsumer, ConsumeResult, FilterExpression,
} = require('rocketmq-client-nodejs');
const { TransactionResolution, FilterType } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

function parseArgs(argv) {
  const out = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a.startsWith('--')) {
      const key = a.slice(2).replace(/-([a-z])/g, (_, c) => c.toUpperCase());
      const next = argv[i + 1];
      if (next === undefined || next.startsWith('--')) out[key] = true;
      else { out[key] = next; i++; }
    } else out._.push(a);
  }
  return out;
}

const args = parseArgs(process.argv.slice(2));
const emit = (event, fields = {}) => process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');
const sleep = ms => new Promise(r => setTimeout(r, ms));
const RESOLUTIONS = {
  commit: TransactionResolution.COMMIT,
  rollback: TransactionResolution.ROLLBACK,
  unknown: TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED,
};

function base() {
  const opts = { endpoints: args.endpoints, requestTimeout: 3000, namespace: '' };
  if (args.ak) opts.sessionCredentials = { accessKey: args.ak, accessSecret: args.sk || '' };
  return opts;
}

function filter() {
  if (args.sql) return new FilterExpression(args.sql, FilterType.SQL);
  return new FilterExpression(args.tagExpr || '*');
}

function describe(m) {
  return {
    id: m.messageId, body: m.body.toString('utf8'), tag: m.tag || null, keys: [...(m.keys || [])].sort(),
    group: m.messageGroup || null, attempt: m.deliveryAttempt, properties: Object.fromEntries(m.properties || []),
    topic: m.topic,
  };
}

async function produce() {
  const producer = new Producer({ ...base(), topic: args.topic });
  await producer.startup();
  try {
    const count = Number(args.count || 1);
    for (let i = 0; i < count; i++) {
      const msg = {
        topic: args.topic, body: Buffer.from(`${args.prefix || 'msg-'}${i}`),
        properties: new Map([['index', String(i)]]),
      };
      if (args.tag) msg.tag = args.tag;
      if (args.keys) msg.keys = [args.keys];
      if (args.group) msg.messageGroup = args.group;
      if (args.delayMs) msg.delay = Number(args.delayMs);
      const r = await producer.send(msg);
      emit('sent', { id: r.messageId, offset: Number(r.offset), recall_handle: r.recallHandle || '',
        body: msg.body.toString() });
    }
  } finally {
    await producer.shutdown();
  }
}

async function transaction() {
  const checker = {
    async check(view) {
      emit('checked', { id: view.messageId, body: view.body.toString(), answer: args.check || 'commit' });
      return RESOLUTIONS[args.check || 'commit'];
    },
  };
  const producer = new Producer({ ...base(), topic: args.topic, checker });
  await producer.startup();
  try {
    const tx = producer.beginTransaction();
    const r = await producer.send({ topic: args.topic, body: Buffer.from(`${args.prefix || 'msg-'}tx`) }, tx);
    emit('half-sent', { id: r.messageId });
    if (args.decision === 'commit') await tx.commit();
    else if (args.decision === 'rollback') await tx.rollback();
    emit('decided', { decision: args.decision });
    await sleep(Number(args.linger || 0) * 1000);
  } finally {
    await producer.shutdown();
  }
}

async function recall() {
  const producer = new Producer({ ...base(), topic: args.topic });
  await producer.startup();
  try {
    const r = await producer.recallMessage(args.topic, args.handle);
    emit('recalled', { id: r.messageId });
  } finally {
    await producer.shutdown();
  }
}

async function simple() {
  const consumer = new SimpleConsumer({
    ...base(), consumerGroup: args.group, subscriptions: new Map([[args.topic, filter()]]),
    awaitDuration: Number(args.awaitS || 5) * 1000,
  });
  await consumer.startup();
  const count = Number(args.count || 1);
  const deadline = Date.now() + Number(args.timeout || 30) * 1000;
  const changed = new Set();
  let got = 0;
  try {
    while (got < count && Date.now() < deadline) {
      const messages = await consumer.receive(Number(args.batch || 16), Number(args.invisible || 10) * 1000);
      for (const m of messages) {
        emit('received', describe(m));
        if (args.changeInvisible !== undefined && !changed.has(m.messageId)) {
          changed.add(m.messageId);
          await consumer.changeInvisibleDuration(m, Number(args.changeInvisible) * 1000);
          emit('changed', { id: m.messageId });
          continue;
        }
        if (!args.noAck) {
          await consumer.ack(m);
          emit('acked', { id: m.messageId });
        }
        got++;
      }
    }
  } finally {
    await consumer.shutdown();
  }
  emit('done', { received: got });
}

async function push() {
  let seen = 0;
  let ok = 0;
  const failFirst = Number(args.failFirst || 0);
  const consumer = new PushConsumer({
    ...base(), consumerGroup: args.group, subscriptions: new Map([[args.topic, filter()]]),
    messageListener: {
      async consume(view) {
        seen++;
        const fail = seen <= failFirst;
        if (!fail) ok++;
        emit('consumed', { ok: !fail, ...describe(view) });
        return fail ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  emit('started');
  const deadline = Date.now() + Number(args.timeout || 30) * 1000;
  while (ok < Number(args.count || 1) && Date.now() < deadline) await sleep(50);
  await consumer.shutdown();
  emit('done', { received: ok });
}

const commands = { produce, transaction, recall, simple, push };
const command = commands[args._[0]];
if (!command) {
  emit('error', { type: 'usage', message: `unknown command ${args._[0]}` });
  process.exit(2);
}
command().then(() => process.exit(0), err => {
  emit('error', { type: err && err.name, message: String(err && (err.stack || err.message || err)) });
  process.exit(2);
});
