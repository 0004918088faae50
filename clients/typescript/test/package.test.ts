// The package loads through its exports map as an ES module and as CommonJS,
// and ships type declarations for both.
import { test } from "node:test";
import { strict as assert } from "node:assert";
import { createRequire } from "node:module";
import { existsSync, readFileSync } from "node:fs";

const pkgUrl = new URL("../../package.json", import.meta.url);
const pkg = JSON.parse(readFileSync(pkgUrl, "utf8"));

test("exports map: import and require both load the client", async () => {
  const esm = await import(pkg.name);
  const cjs = createRequire(pkgUrl)(pkg.name);
  for (const m of [esm, cjs]) {
    assert.equal(typeof m.connect, "function");
    assert.equal(typeof m.SubscriptionEndedError, "function");
    assert.equal(m.backoffDelay({}, 0, 0.5), 100);
  }
  assert.notEqual(esm.connect, cjs.connect, "two builds, not one loaded twice");
  for (const cond of ["import", "require"]) {
    const types = new URL(pkg.exports["."][cond].types, pkgUrl);
    assert.ok(existsSync(types), `missing ${types}`);
  }
  assert.deepEqual(pkg.dependencies ?? {}, {}, "no runtime dependencies");
});
