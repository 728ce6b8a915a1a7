// Runs the console's verify.js leaf checks under node (WebCrypto is built in): the file
// is loaded as the page loads it, with a document that never fires, and each case read
// from stdin goes to checkLeafV2 (a leaf and the environment it names) or openLeafV2
// (a leaf alone). Prints one {"ok"} or {"error"} per case, in order.
import fs from "node:fs";
import vm from "node:vm";

const script = process.argv[2];
const page = vm.createContext({
  atob, btoa, crypto, TextEncoder, TextDecoder,
  document: { addEventListener() {}, getElementById() { return null; } },
});
vm.runInContext(fs.readFileSync(script, "utf8"), page, { filename: script });

const results = [];
for (const c of JSON.parse(fs.readFileSync(0, "utf8"))) {
  try {
    const envelope = page.b64decode(c.envelope_base64);
    if (c.evidence) await page.checkLeafV2(c.evidence, envelope, c.origin);
    else await page.openLeafV2(envelope, page.b64decode(c.body_base64), c.origin);
    results.push({ ok: true });
  } catch (err) {
    results.push({ error: String(err && err.message) });
  }
}
process.stdout.write(JSON.stringify(results));
