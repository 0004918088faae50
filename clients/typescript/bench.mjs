// Throughput of the TypeScript client against a running broker, for comparison
// with `sinew bench` (the Go SDK) and clients/python/bench.py. Build first
// (npm run build).
//
//   node bench.mjs publish --addr 127.0.0.1:7654 --window 64 --duration 5
//   node bench.mjs drain --addr 127.0.0.1:7654 --count 50000 --prefetch 256
//
// publish keeps --window publishes in flight, each waiting for its confirm,
// for --duration seconds (after a 1 s warm-up). drain prefills --count
// messages, then consumes and completes them all.
import { parseArgs } from "node:util";
import { randomBytes } from "node:crypto";
import { connect } from "./dist/esm/index.js";

const { positionals, values: a } = parseArgs({
  allowPositionals: true,
  options: {
    addr: { type: "string", default: "127.0.0.1:7654" },
    topic: { type: "string", default: "" },
    window: { type: "string", default: "64" },
    duration: { type: "string", default: "5" },
    count: { type: "string", default: "50000" },
    prefetch: { type: "string", default: "256" },
    size: { type: "string", default: "1024" },
  },
});
const mode = positionals[0];
if (mode !== "publish" && mode !== "drain") {
  console.error("usage: node bench.mjs publish|drain [--addr host:port] ...");
  process.exit(2);
}
const topic = a.topic || `tsbench-${mode}-${process.pid}`;
const body = randomBytes(Number(a.size));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

if (mode === "publish") {
  const window = Number(a.window);
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
  await sleep(Number(a.duration) * 1000);
  measuring = false;
  const el = (performance.now() - t0) / 1000;
  stop = true;
  await Promise.all(workers);
  await c.close();
  lat.sort((x, y) => x - y);
  const p50 = lat[Math.floor(lat.length / 2)];
  const p99 = lat[Math.floor(lat.length * 0.99)];
  console.log(
    `publish window=${window} size=${a.size}: ${Math.round(count / el).toLocaleString("en")} msg/s, ` +
      `p50 ${p50.toFixed(3)} ms, p99 ${p99.toFixed(3)} ms, ${count} msgs in ${el.toFixed(2)} s`,
  );
} else {
  const n = Number(a.count);
  const c = await connect(a.addr, { publishWindow: 256 });
  const fills = [];
  for (let i = 0; i < n; i++) fills.push(c.publish(topic, body));
  await Promise.all(fills);
  const sub = await c.subscribe(topic, { prefetch: Number(a.prefetch) });
  const t0 = performance.now();
  const settles = [];
  let got = 0;
  for await (const m of sub) {
    settles.push(m.complete());
    if (++got === n) break;
  }
  await Promise.all(settles);
  const el = (performance.now() - t0) / 1000;
  await c.close();
  console.log(`drain count=${n} prefetch=${a.prefetch} size=${a.size}: ${Math.round(n / el).toLocaleString("en")} msg/s in ${el.toFixed(2)} s`);
}
