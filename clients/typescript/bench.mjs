// Throughput of the TypeScript client against a running broker, for comparison
// with `sinew bench` (the Go SDK) and clients/python/bench.py. Build first
// (npm run build).
//
//   node bench.mjs publish --addr 127.0.0.1:7654 --window 64 --duration 5
//   node bench.mjs drain --addr 127.0.0.1:7654 --count 50000 --prefetch 1000
//   node bench.mjs compare --addr 127.0.0.1:7654 --sinew ../../sinew --rounds 3
//
// publish keeps --window publishes in flight, each waiting for its confirm,
// for --duration seconds (after a 1 s warm-up). drain prefills --count
// messages, then consumes them with the README's worker loop
// (`for await (const msg of sub) { ...; await msg.complete(); }`, fast
// settles; --confirmed makes each wait for the broker) and measures from the subscribe to the last delivery, as
// `sinew bench drain` does. compare runs the Go SDK (`sinew bench publish`
// and `sinew bench drain` with the same window, prefetch, count and size,
// from the binary --sinew or $SINEW_BIN) and this client alternately on the
// same broker, --rounds times, and prints each figure and the medians' ratio.
import { parseArgs } from "node:util";
import { randomBytes } from "node:crypto";
import { execFileSync } from "node:child_process";
import { connect } from "./dist/esm/index.js";

const { positionals, values: a } = parseArgs({
  allowPositionals: true,
  options: {
    addr: { type: "string", default: "127.0.0.1:7654" },
    topic: { type: "string", default: "" },
    window: { type: "string", default: "64" },
    duration: { type: "string", default: "5" },
    count: { type: "string", default: "50000" },
    prefetch: { type: "string", default: "1000" },
    size: { type: "string", default: "1024" },
    sinew: { type: "string", default: process.env.SINEW_BIN || "sinew" },
    rounds: { type: "string", default: "3" },
    confirmed: { type: "boolean", default: false },
  },
});
const mode = positionals[0];
if (mode !== "publish" && mode !== "drain" && mode !== "compare") {
  console.error("usage: node bench.mjs publish|drain|compare [--addr host:port] ...");
  process.exit(2);
}
const body = randomBytes(Number(a.size));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let runs = 0;
const freshTopic = (m) => a.topic || `tsbench-${m}-${process.pid}-${runs++}`;

async function publishBench(window, seconds) {
  const topic = freshTopic("publish");
  const c = await connect(a.addr, { publishWindow: window });
  const lat = [];
  let count = 0;
  let measuring = false;
  let stop = false;
  const worker = async () => {
    while (!stop) {
      const t0 = performance.now();
      await c.publish(topic, body);
      if (measuring) {
        lat.push(performance.now() - t0);
        count++;
      }
    }
  };
  const workers = Array.from({ length: window }, worker);
  await sleep(1000); // warm-up
  measuring = true;
  const t0 = performance.now();
  await sleep(seconds * 1000);
  measuring = false;
  const el = (performance.now() - t0) / 1000;
  stop = true;
  await Promise.all(workers);
  await c.deleteQueue(topic).catch(() => {});
  await c.close();
  lat.sort((x, y) => x - y);
  return { rate: count / el, count, el, p50: lat[Math.floor(lat.length / 2)], p99: lat[Math.floor(lat.length * 0.99)] };
}

async function drainBench(n, prefetch) {
  const topic = freshTopic("drain");
  const c = await connect(a.addr, { publishWindow: 256 });
  const fills = [];
  for (let i = 0; i < n; i++) fills.push(c.publish(topic, body));
  await Promise.all(fills);
  const t0 = performance.now();
  const sub = await c.subscribe(topic, { prefetch });
  let got = 0;
  // The README's worker loop.
  for await (const msg of sub) {
    await msg.complete(settleOpts);
    if (++got === n) break;
  }
  const el = (performance.now() - t0) / 1000;
  const t1 = performance.now();
  await c.deleteQueue(topic).catch(() => {});
  await c.close(); // sends the last settles
  const closeEl = (performance.now() - t1) / 1000;
  return { rate: n / el, el, closeEl };
}

function goBench(m) {
  const args = ["bench", m, "--addr", a.addr, "--size", a.size, "--json", "--quiet"];
  if (m === "publish") args.push("--window", a.window, "--duration", `${a.duration}s`, "--warmup", "1s");
  else args.push("--count", a.count, "--prefetch", a.prefetch, "--window", "256");
  const out = execFileSync(a.sinew, args, { encoding: "utf8", maxBuffer: 1 << 20 });
  return JSON.parse(out).msg_per_sec;
}

// --confirmed: each settle waits for the broker's answer (the client's
// behaviour before fast settles), for comparison.
const settleOpts = a.confirmed ? { confirmed: true } : undefined;
const fmt = (x) => Math.round(x).toLocaleString("en");
const median = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];

if (mode === "publish") {
  const r = await publishBench(Number(a.window), Number(a.duration));
  console.log(
    `publish window=${a.window} size=${a.size}: ${fmt(r.rate)} msg/s, ` +
      `p50 ${r.p50.toFixed(3)} ms, p99 ${r.p99.toFixed(3)} ms, ${r.count} msgs in ${r.el.toFixed(2)} s`,
  );
} else if (mode === "drain") {
  const r = await drainBench(Number(a.count), Number(a.prefetch));
  console.log(`drain count=${a.count} prefetch=${a.prefetch} size=${a.size}: ${fmt(r.rate)} msg/s in ${r.el.toFixed(2)} s (close ${r.closeEl.toFixed(2)} s)`);
} else {
  const rounds = Number(a.rounds);
  const res = { goPub: [], tsPub: [], goDrain: [], tsDrain: [] };
  for (let i = 0; i < rounds; i++) {
    // Alternate which client goes first, so neither always meets a warmer broker.
    const order = i % 2 === 0 ? ["go", "ts"] : ["ts", "go"];
    for (const who of order) {
      if (who === "go") res.goPub.push(goBench("publish"));
      else res.tsPub.push((await publishBench(Number(a.window), Number(a.duration))).rate);
    }
    for (const who of order) {
      if (who === "go") res.goDrain.push(goBench("drain"));
      else res.tsDrain.push((await drainBench(Number(a.count), Number(a.prefetch))).rate);
    }
    console.log(
      `round ${i + 1}: publish window=${a.window} go ${fmt(res.goPub[i])} ts ${fmt(res.tsPub[i])} msg/s; ` +
        `drain prefetch=${a.prefetch} count=${a.count} go ${fmt(res.goDrain[i])} ts ${fmt(res.tsDrain[i])} msg/s`,
    );
  }
  const pr = median(res.tsPub) / median(res.goPub);
  const dr = median(res.tsDrain) / median(res.goDrain);
  console.log(`median publish: go ${fmt(median(res.goPub))} ts ${fmt(median(res.tsPub))} msg/s, ts/go ${pr.toFixed(2)} (goal >= 0.70)`);
  console.log(`median drain:   go ${fmt(median(res.goDrain))} ts ${fmt(median(res.tsDrain))} msg/s, ts/go ${dr.toFixed(2)} (goal >= 0.50)`);
}
