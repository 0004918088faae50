// TLS, mutual TLS and user login against a real `sinew serve`, with
// certificates from `sinew cert generate`.
import { test, before, after } from "node:test";
import { strict as assert } from "node:assert";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { Broker, sinewBin } from "./broker.js";
import { connect, BrokerError, DisconnectedError, TLSError, type Client, type ConnectOptions, type TLSOptions } from "../src/index.js";

const T = { timeout: 20_000 };

type Certs = { ca: Buffer; cert: Buffer; key: Buffer; files: { ca: string; cert: string; key: string; serverCert: string; serverKey: string } };

let dir: string;
let certs: Certs; // the brokers' CA
let otherCerts: Certs; // a CA the brokers do not know
let mtls: Broker; // TLS, client certificates required, user alice
let tlsOnly: Broker; // TLS, no client certificates, no users
let plain: Broker; // plaintext

function generate(sub: string): Certs {
  const d = path.join(dir, sub);
  execFileSync(sinewBin(), ["cert", "generate", "--dir", d], { stdio: "ignore" });
  const files = {
    ca: path.join(d, "ca.pem"),
    cert: path.join(d, "client.pem"),
    key: path.join(d, "client-key.pem"),
    serverCert: path.join(d, "server.pem"),
    serverKey: path.join(d, "server-key.pem"),
  };
  return { ca: readFileSync(files.ca), cert: readFileSync(files.cert), key: readFileSync(files.key), files };
}

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), "sinew-ts-tls-"));
  certs = generate("ca");
  otherCerts = generate("other");
  const serverTLS = ["--tls-cert-file", certs.files.serverCert, "--tls-key-file", certs.files.serverKey];
  mtls = new Broker([...serverTLS, "--tls-client-ca-file", certs.files.ca, "--tls-client-auth", "require"]);
  execFileSync(
    sinewBin(),
    ["admin", "user", "add", "--data-dir", mtls.dataDir, "--publish", "tls-*", "--consume", "tls-*", "--manage", "tls-*", "--password-stdin", "alice"],
    { input: "alice-password-1\n", stdio: ["pipe", "ignore", "inherit"] },
  );
  tlsOnly = new Broker(serverTLS);
  plain = new Broker();
  await Promise.all([mtls.start(), tlsOnly.start(), plain.start()]);
});
after(async () => {
  await Promise.all([mtls?.destroy(), tlsOnly?.destroy(), plain?.destroy()]);
  rmSync(dir, { recursive: true, force: true });
});

/** Options that fail a first connect on the first retryable error, and record connect events. */
function once(o: ConnectOptions, events: string[] = []): ConnectOptions {
  return { connectTimeoutMs: 10_000, reconnect: { maxAttempts: 1 }, log: (e) => events.push(e), ...o };
}

async function roundTrip(c: Client, topic: string): Promise<void> {
  try {
    const r = await c.publish(topic, "over tls");
    const sub = await c.subscribe(topic, { prefetch: 1 });
    const it = sub[Symbol.asyncIterator]();
    const m = (await it.next()).value;
    assert.equal(m.text, "over tls");
    assert.equal(m.offset, r.offset);
    await m.complete();
  } finally {
    await c.close();
  }
}

test("TLS with a private CA: publish and consume", T, async () => {
  await roundTrip(await connect(tlsOnly.addr, once({ tls: { ca: certs.ca } })), "tls-basic");
});

test("mutual TLS and a user login: publish and consume", T, async () => {
  const tls: TLSOptions = { ca: certs.ca, cert: certs.cert, key: certs.key };
  await roundTrip(await connect(mtls.addr, once({ tls, user: "alice", credentials: "alice-password-1" })), "tls-mutual");
});

test("mutual TLS: a wrong password is auth_failed", T, async () => {
  const tls: TLSOptions = { ca: certs.ca, cert: certs.cert, key: certs.key };
  const events: string[] = [];
  await assert.rejects(connect(mtls.addr, once({ tls, user: "alice", credentials: "wrong" }, events)), (e: unknown) => {
    assert.ok(e instanceof BrokerError, String(e));
    assert.equal(e.codeName, "auth_failed");
    return true;
  });
  assert.deepEqual(events, ["connect_failed_fatal"]);
  // No credentials at all: refused the same way.
  await assert.rejects(connect(mtls.addr, once({ tls })), { name: "BrokerError", codeName: "auth_failed" });
});

test("mutual TLS: no client certificate, or one from another CA, is a TLSError at once", T, async () => {
  for (const tls of [
    { ca: certs.ca },
    { ca: certs.ca, cert: otherCerts.cert, key: otherCerts.key },
  ] satisfies TLSOptions[]) {
    const events: string[] = [];
    await assert.rejects(connect(mtls.addr, once({ tls, user: "alice", credentials: "alice-password-1" }, events)), (e: unknown) => {
      // Under TLS 1.3 the broker's verdict follows the handshake, and its
      // close may reset the connection before the alert is read: that attempt
      // looks like a network failure (retried; here maxAttempts is 1).
      const code = ((e as Error).cause as { code?: string } | undefined)?.code;
      if (e instanceof DisconnectedError && (code === "ECONNRESET" || code === "EPIPE")) return true;
      assert.ok(e instanceof TLSError, String(e));
      assert.equal(e.retryable, false);
      assert.match(e.message, /TLS handshake failed/);
      assert.deepEqual(events, ["connect_failed_fatal"], "not retried");
      return true;
    });
  }
});

test("TLS: a broker certificate from an unknown CA, or for another name, is a TLSError", T, async () => {
  for (const [tls, code] of [
    [{ ca: otherCerts.ca }, "UNABLE_TO_VERIFY_LEAF_SIGNATURE"],
    [{}, "UNABLE_TO_VERIFY_LEAF_SIGNATURE"], // Node's default CAs do not know a private CA
    [{ ca: certs.ca, servername: "broker.example.com" }, "ERR_TLS_CERT_ALTNAME_INVALID"],
  ] as Array<[TLSOptions, string]>) {
    await assert.rejects(connect(tlsOnly.addr, once({ tls })), (e: unknown) => {
      assert.ok(e instanceof TLSError, String(e));
      assert.equal((e.cause as { code?: string }).code, code);
      return true;
    });
  }
  // servername names what the certificate must carry: localhost is in it.
  await (await connect(tlsOnly.addr, once({ tls: { ca: certs.ca, servername: "localhost" } }))).close();
});

test("a TLS client on a plaintext port fails at once with a clear TLSError", T, async () => {
  const events: string[] = [];
  await assert.rejects(connect(plain.addr, once({ tls: { ca: certs.ca }, reconnect: { maxAttempts: 0 } }, events)), (e: unknown) => {
    assert.ok(e instanceof TLSError, String(e));
    assert.match(e.message, /did not speak TLS/);
    return true;
  });
  assert.deepEqual(events, ["connect_failed_fatal"], "not retried until the connect timeout");
});

test("a plaintext client on a TLS port gets the broker's 'requires TLS' error", T, async () => {
  const events: string[] = [];
  await assert.rejects(connect(tlsOnly.addr, once({ reconnect: { maxAttempts: 0 } }, events)), (e: unknown) => {
    assert.ok(e instanceof BrokerError, String(e));
    assert.equal(e.codeName, "bad_request");
    assert.match(e.message, /this port requires TLS/);
    return true;
  });
  assert.deepEqual(events, ["connect_failed_fatal"]);
});

test("tls.cert without tls.key is a TLSError", T, async () => {
  await assert.rejects(connect(tlsOnly.addr, once({ tls: { ca: certs.ca, cert: certs.cert } })), {
    name: "TLSError",
    message: /go together/,
  });
});
