// In-browser verification of one audit record, the same checks as `audit-ledger verify`.
// Inputs: the evidence block in the page, the record this page was asked for (its URL),
// and the keys the auditor pinned (the log's key, and witness keys). No verdict comes
// from the server: every hash and signature is computed here with WebCrypto.
//   1. the bytes are the record asked for (id from the URL, leaf index from the link) and
//      SHA-256(0x00 || bytes) equals the leaf hash the log holds (RFC 9162 2.1.1)
//   2. the inclusion proof leads from that leaf to the checkpoint's root (RFC 9162 2.1.3.2)
//   3. the checkpoint note carries a valid Ed25519 signature by the pinned log key
//   4. the checkpoint is consistent with the anchored one (RFC 9162 2.1.4.2) and pinned
//      witnesses cosigned it (C2SP cosignature/v1); the operator's own anchor alone is
//      SELF-ANCHORED, never verified. A Fabric anchor is checked by the CLI only.
// Nothing runs before a log key is pinned: bytes compared with a hash from the same
// server prove nothing on their own.
"use strict";

const PIN_STORAGE = "audit-ledger.pins";
const PIN_COOKIE = "alc_pin_session";
const enc = new TextEncoder();

function $(id) { return document.getElementById(id); }

// Canonical padded base64 only, as the command-line verifier and Go read it: atob skips
// whitespace and missing padding and ignores padding bits, so one value could be spelled
// many ways; the bytes must encode back to the very same text.
function b64decode(text) {
  const raw = atob(text);
  if (btoa(raw) !== text) throw new Error("not canonical base64");
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function unhex(text) {
  if (typeof text !== "string" || !/^([0-9a-f]{2})*$/.test(text)) throw new Error("not lowercase hex: " + text);
  const out = new Uint8Array(text.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(text.substr(i * 2, 2), 16);
  return out;
}

function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

function equal(a, b) {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}

// Control and bidirectional-formatting characters shown as <U+XXXX>: untrusted text must
// read as what it is (a driver "\u202e51.45.055" must not display as 550.54.15).
function visible(text) {
  return String(text).replace(/[\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/g,
    (c) => "<U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + ">");
}

async function sha256(bytes) {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
}

const hashLeaf = (data) => sha256(concat(new Uint8Array([0]), data));
const hashChildren = (l, r) => sha256(concat(new Uint8Array([1]), l, r));

// RFC 9162 2.1.3.2: the root an inclusion proof leads to, or an error.
async function rootFromInclusion(leaf, index, size, proof) {
  if (index >= size) throw new Error(`leaf index ${index} is not below tree size ${size}`);
  let fn = index, sn = size - 1, r = leaf;
  for (const p of proof) {
    if (sn === 0) throw new Error("proof is longer than the tree allows");
    if (fn % 2 === 1 || fn === sn) {
      r = await hashChildren(p, r);
      if (fn % 2 === 0) {
        while (fn % 2 === 0 && fn !== 0) { fn = Math.floor(fn / 2); sn = Math.floor(sn / 2); }
      }
    } else {
      r = await hashChildren(r, p);
    }
    fn = Math.floor(fn / 2); sn = Math.floor(sn / 2);
  }
  if (sn !== 0) throw new Error("proof is shorter than the tree needs");
  return r;
}

// RFC 9162 2.1.4.2: throws unless the tree (second, secondRoot) extends (first, firstRoot).
async function verifyConsistency(first, second, proof, firstRoot, secondRoot) {
  if (!(first >= 1 && first <= second)) throw new Error(`sizes ${first} and ${second} cannot be compared`);
  if (first === second) {
    if (proof.length !== 0) throw new Error("a proof between equal sizes must be empty");
    if (!equal(firstRoot, secondRoot)) throw new Error(`fork: two different roots for size ${first}`);
    return;
  }
  const path = (first & (first - 1)) === 0 ? [firstRoot, ...proof] : [...proof];
  if (path.length === 0) throw new Error("the consistency proof is empty");
  let fn = first - 1, sn = second - 1;
  while (fn % 2 === 1) { fn = Math.floor(fn / 2); sn = Math.floor(sn / 2); }
  let fr = path[0], sr = path[0];
  for (const c of path.slice(1)) {
    if (sn === 0) throw new Error("the consistency proof is longer than the trees allow");
    if (fn % 2 === 1 || fn === sn) {
      fr = await hashChildren(c, fr);
      sr = await hashChildren(c, sr);
      while (fn % 2 === 0 && fn !== 0) { fn = Math.floor(fn / 2); sn = Math.floor(sn / 2); }
    } else {
      sr = await hashChildren(sr, c);
    }
    fn = Math.floor(fn / 2); sn = Math.floor(sn / 2);
  }
  if (sn !== 0) throw new Error("the consistency proof is shorter than the trees need");
  if (!equal(fr, firstRoot) || !equal(sr, secondRoot)) {
    throw new Error(`size ${second} does not extend size ${first}: a fork or a rewritten history`);
  }
}

// name+hex(key hash)+base64(alg || Ed25519 public key); "+" may occur in the base64.
function splitVkey(text) {
  const trimmed = text.trim();
  const first = trimmed.indexOf("+"), second = trimmed.indexOf("+", first + 1);
  if (first <= 0 || second < 0) throw new Error("a verifier key is name+hash+key");
  return { name: trimmed.slice(0, first), hashHex: trimmed.slice(first + 1, second),
           raw: b64decode(trimmed.slice(second + 1)), text: trimmed };
}

// The log's signed-note key (algorithm 0x01, hash over name "\n" 0x01 key).
async function decodeVerifierKey(text) {
  const { name, hashHex, raw, text: trimmed } = splitVkey(text);
  if (raw.length !== 33 || raw[0] !== 1) throw new Error("only Ed25519 verifier keys are supported");
  const pub = raw.slice(1);
  const keyHash = (await sha256(concat(enc.encode(name + "\n"), new Uint8Array([1]), pub))).slice(0, 4);
  if (hex(keyHash) !== hashHex) throw new Error("the key hash does not match the key");
  const key = await crypto.subtle.importKey("raw", pub, { name: "Ed25519" }, false, ["verify"]);
  return { name, keyHash, key, text: trimmed };
}

// A witness key (cosignature/v1: algorithm 0x04, hash over name "\n" 0x04 key).
async function decodeWitnessKey(text) {
  const { name, hashHex, raw, text: trimmed } = splitVkey(text);
  if (raw.length !== 33 || raw[0] !== 4) throw new Error(`witness key ${name}: not a cosignature/v1 key (type 0x04)`);
  const pub = raw.slice(1);
  const keyHash = (await sha256(concat(enc.encode(name + "\n"), new Uint8Array([4]), pub))).slice(0, 4);
  if (hex(keyHash) !== hashHex) throw new Error(`witness key ${name}: the key hash does not match the key`);
  const key = await crypto.subtle.importKey("raw", pub, { name: "Ed25519" }, false, ["verify"]);
  return { name, keyHash, key, text: trimmed };
}

// Body and signature lines of a signed note; the body ends with its last newline.
function parseNote(text) {
  const split = text.lastIndexOf("\n\n");
  if (split < 0 || !text.endsWith("\n")) throw new Error("not a signed note");
  const body = text.slice(0, split + 1);
  const raw = text.slice(split + 2, -1).split("\n");
  if (raw.length > 100) throw new Error("more than 100 signature lines");
  const lines = raw.map((line) => {
    const m = /^\u2014 (\S+) ([A-Za-z0-9+/=]+)$/.exec(line);
    if (!m) throw new Error("malformed signature line");
    const blob = b64decode(m[2]);
    return { name: m[1], keyHash: blob.slice(0, 4), signature: blob.slice(4), line };
  });
  return { body, lines };
}

function parseCheckpointBody(body) {
  const lines = body.slice(0, -1).split("\n");
  if (lines.length < 3 || !/^(0|[1-9][0-9]*)$/.test(lines[1])) throw new Error("malformed checkpoint body");
  const root = b64decode(lines[2]);
  if (root.length !== 32) throw new Error("checkpoint root is not 32 bytes");
  return { origin: lines[0], size: Number(lines[1]), root };
}

// The checkpoint inside a note, signed by the pinned log key for its origin; or an error.
async function openCheckpoint(noteText, pinned) {
  const note = parseNote(noteText);
  const mine = note.lines.filter((s) => s.name === pinned.name && equal(s.keyHash, pinned.keyHash));
  if (mine.length === 0) throw new Error(`note carries no signature by key ${pinned.name}+${hex(pinned.keyHash)}`);
  // Every line in the pinned key's name must verify: a corrupted copy beside the genuine
  // line is refused, whatever the order.
  for (const s of mine) {
    if (!await crypto.subtle.verify({ name: "Ed25519" }, pinned.key, s.signature, enc.encode(note.body))) {
      throw new Error(`signature by key ${pinned.name} does not verify${mine.length > 1 ? " (one of its repeated lines)" : ""}`);
    }
  }
  const checkpoint = parseCheckpointBody(note.body);
  if (checkpoint.origin !== pinned.name) {
    throw new Error(`checkpoint is for origin ${checkpoint.origin}, the pinned key is ${pinned.name}`);
  }
  return { checkpoint, note };
}

// Names of pinned witnesses with a valid cosignature on the note.
async function cosigners(noteText, witnesses) {
  const note = parseNote(noteText);
  const found = new Set();
  for (const w of witnesses) {
    for (const s of note.lines) {
      if (s.name !== w.name || !equal(s.keyHash, w.keyHash) || s.signature.length !== 72) continue;
      const time = new DataView(s.signature.buffer, s.signature.byteOffset, 8).getBigUint64(0);
      const message = concat(enc.encode(`cosignature/v1\ntime ${time}\n`), enc.encode(note.body));
      if (await crypto.subtle.verify({ name: "Ed25519" }, w.key, s.signature.slice(8), message)) {
        found.add(w.name);
        break;
      }
    }
  }
  return found;
}

// RFC 8785 text of a parsed JSON value. JSON.stringify already writes strings and numbers
// as RFC 8785 does (ECMAScript number form, the same escapes); only the key order, by
// UTF-16 code units (the default sort), is added.
function canonicalJson(value) {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  if (Array.isArray(value)) return "[" + value.map(canonicalJson).join(",") + "]";
  return "{" + Object.keys(value).sort().map((k) => JSON.stringify(k) + ":" + canonicalJson(value[k])).join(",") + "}";
}

// The value of bytes that must be canonical JSON, else an error naming `where`. Reading
// them back into the same bytes refuses duplicate keys (JSON.parse keeps the last), a
// byte order mark (the decoder drops it), whitespace and any other second spelling:
// bytes one parser could read differently from another never get this far.
function parseCanonical(bytes, where) {
  let value;
  try {
    value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (err) {
    throw new Error(`${where}: not UTF-8 JSON (${err.message})`);
  }
  if (!equal(enc.encode(canonicalJson(value)), bytes)) {
    throw new Error(`${where}: not in RFC 8785 canonical form (a duplicate key, a byte order mark, whitespace or another spelling)`);
  }
  return value;
}

// RFC 3339 UTC with milliseconds, ASCII digits, and a real instant (no month 13, no
// 24:00, no leap second), as ledger/timestamps.py's is_timestamp.
const TIMESTAMP = /^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$/;
function isTimestamp(text) {
  if (typeof text !== "string" || !TIMESTAMP.test(text) || text.startsWith("0000")) return false;
  const time = new Date(text);
  return !Number.isNaN(time.getTime()) && time.toISOString() === text;
}

// Each v2 kind's members, from ledger/leaves (decision records 0026, 0043): exactly the
// required ones, else only the optional ones, in the body and in each nested section.
// Any other kind is refused: a member the writer never writes (a prompt in plain text)
// must not reach the page as if the log vouched for it.
const ENVIRONMENT_REF = { required: ["leaf_index", "leaf_hash"] };
const V2_KINDS = {
  "audit-record/v2": {
    scoped: true,
    required: ["schema", "record_id", "created_at", "tenant", "engine", "environment", "commitments", "data", "batch", "timings_ms", "gpu_sample"],
    optional: ["stream"],
    sections: {
      environment: ENVIRONMENT_REF,
      commitments: { required: ["input", "input_ids", "output", "output_ids"], optional: ["stop", "user"] },
      data: { required: ["input_token_count", "output_token_count", "truncated", "finish_reason", "shape", "padding", "generation"],
              sections: { padding: { required: ["side", "count"] } } },
      batch: { required: ["id", "size", "row"] },
      stream: { required: ["start_record_id"] },
    },
  },
  "environment/v1": {
    scoped: false,
    required: ["schema", "record_id", "created_at", "engine", "model", "hardware", "software", "tokenization_contract", "generation_config_digest"],
  },
  "audit-stream-start/v2": {
    scoped: true,
    required: ["schema", "record_id", "created_at", "tenant", "engine", "environment", "commitments", "data"],
    sections: {
      environment: ENVIRONMENT_REF,
      commitments: { required: ["input"], optional: ["stop", "user"] },
      data: { required: ["generation", "route"] },
    },
  },
  "access-record/v2": {
    scoped: true,
    required: ["schema", "record_id", "created_at", "tenant", "access"],
    sections: { access: { required: ["record_id", "accessor", "purpose", "channel"],
                          sections: { accessor: { required: ["key_id", "role", "tenant"] } } } },
  },
  "erasure-record/v2": {
    scoped: true,
    required: ["schema", "record_id", "created_at", "tenant", "erasure"],
    sections: { erasure: { required: ["records", "reason", "selector", "requested_by"], optional: ["legal_basis", "cancels"] } },
  },
  "report-record/v2": {
    scoped: true,
    required: ["schema", "record_id", "created_at", "tenant", "report"],
    sections: { report: { required: ["digest", "from", "to", "scope_tenant", "made_by", "file"] } },
  },
};
const ENVELOPE_MEMBERS = { required: ["schema", "kind", "created_at", "tenant_tag", "body"] };

function checkMembers(value, rule, where) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw new Error(`${where}: must be an object`);
  const allowed = new Set([...rule.required, ...(rule.optional || [])]);
  const own = (k) => Object.prototype.hasOwnProperty.call(value, k);
  const wrong = [...rule.required.filter((k) => !own(k)), ...Object.keys(value).filter((k) => !allowed.has(k))];
  if (wrong.length) throw new Error(`${where}: must hold exactly ${rule.required.join(", ")}${rule.optional ? ` (and optionally ${rule.optional.join(", ")})` : ""}; wrong: ${wrong.sort().join(", ")}`);
  for (const [name, sub] of Object.entries(rule.sections || {})) {
    if (own(name)) checkMembers(value[name], sub, `${where}.${name}`);
  }
}

// Record v2 (audit-leaf/v2): the leaf is a small envelope; the body beside it must hash
// to the envelope's "body", be canonical, be one of the v2 kinds with exactly its
// members, and agree with the envelope's kind, time and tenant tag (ledger/leaves/kinds.py
// open_leaf with strict=True, as the CLI's verify and fsck open it).
async function openLeafV2(envelopeBytes, bodyBytes, origin) {
  const envelope = parseCanonical(envelopeBytes, "envelope");
  checkMembers(envelope, ENVELOPE_MEMBERS, "envelope");
  if (envelope.schema !== "audit-leaf/v2") throw new Error("the leaf is not an audit-leaf/v2 envelope");
  if (!isTimestamp(envelope.created_at)) throw new Error("envelope.created_at: must be RFC 3339 UTC with milliseconds, a real time");
  const digest = "sha256:" + hex(await sha256(bodyBytes));
  if (digest !== envelope.body) throw new Error(`the body hashes to ${digest}, the envelope names ${envelope.body}`);
  const rule = Object.prototype.hasOwnProperty.call(V2_KINDS, envelope.kind) ? V2_KINDS[envelope.kind] : null;
  if (!rule) throw new Error(`envelope.kind: must be one of ${Object.keys(V2_KINDS).sort().join(", ")}`);
  const body = parseCanonical(bodyBytes, "body");
  if (!body || typeof body !== "object" || body.schema !== envelope.kind) throw new Error(`the envelope's kind is ${envelope.kind}, the body's schema is ${body && body.schema}`);
  checkMembers(body, rule, envelope.kind);
  if (!isTimestamp(body.created_at)) throw new Error(`${envelope.kind}.created_at: must be RFC 3339 UTC with milliseconds, a real time`);
  if (body.created_at !== envelope.created_at) throw new Error(`the envelope's time ${envelope.created_at} is not the body's ${body.created_at}`);
  const expected = rule.scoped
    ? "sha256:" + hex(await sha256(enc.encode(`audit-ledger tenant-tag/v1\n${origin}\n${body.tenant}`))) : null;
  if (envelope.tenant_tag !== expected) throw new Error(`the envelope's tenant tag ${envelope.tenant_tag} is not the tag of tenant ${JSON.stringify(body.tenant)}`);
  return { envelope, body };
}

const NAMES_ENVIRONMENT = new Set(["audit-record/v2", "audit-stream-start/v2"]);

// Check 1 for a v2 leaf, and for a record the environment leaf (and, streamed, the stream
// start leaf) it names. Returns their leaf hashes (for check 2) or null. The same checks,
// in the same order, as ledger/verify.py's _check_environment and _check_stream_start.
async function checkLeafV2(evidence, bytes, origin) {
  const opened = await openLeafV2(bytes, b64decode(evidence.body_base64), origin);
  // A record and a stream start name the environment they ran under (decision 0043).
  if (!NAMES_ENVIRONMENT.has(opened.envelope.kind)) return { body: opened.body, environmentLeaf: null, environment: null, startLeaf: null };
  const named = opened.body.environment;
  const given = evidence.environment;
  if (!given) throw new Error(`the record names environment leaf ${named.leaf_index} and the server gave none`);
  if (given.leaf_index !== named.leaf_index) throw new Error(`the server gave leaf ${given.leaf_index} as the environment, the record names leaf ${named.leaf_index}`);
  const envelope = b64decode(given.envelope_base64);
  const environment = await openLeafV2(envelope, b64decode(given.body_base64), origin);
  if (environment.envelope.kind !== "environment/v1") throw new Error(`leaf ${given.leaf_index} is not an environment`);
  // An environment is declared before the records that ran under it, by their engine.
  if (!(Number.isSafeInteger(given.leaf_index) && given.leaf_index < evidence.leaf_index)) {
    throw new Error(`environment leaf ${given.leaf_index} was appended after record leaf ${evidence.leaf_index}`);
  }
  if (environment.body.engine !== opened.body.engine) {
    throw new Error(`the record ran on ${opened.body.engine}, its environment leaf is ${environment.body.engine}'s`);
  }
  const environmentLeaf = await hashLeaf(envelope);
  if (hex(environmentLeaf) !== named.leaf_hash) throw new Error(`the environment leaf hashes to ${hex(environmentLeaf)}, the record names ${named.leaf_hash}`);
  const streamed = opened.envelope.kind === "audit-record/v2" && Object.prototype.hasOwnProperty.call(opened.body, "stream");
  const startLeaf = streamed ? await checkStreamStart(evidence, opened, origin) : null;
  return { body: opened.body, environmentLeaf, environment: environment.body, startLeaf };
}

// A streamed record's stream start leaf (decision 0050), judged as ledger/verify.py's
// _check_stream_start and ledger/leaves/stream_link.py do: given, opened, the leaf of the
// id the record names, an audit-stream-start/v2 before the record, of the record's tenant,
// committing the same prompt (and stop strings and user). Returns its leaf hash (check 2).
async function checkStreamStart(evidence, opened, origin) {
  const named = opened.body.stream.start_record_id;
  const given = evidence.stream_start;
  if (!given) throw new Error(`stream start: the record names stream start ${named} and the server gave no such leaf`);
  const envelope = b64decode(given.envelope_base64);
  const start = await openLeafV2(envelope, b64decode(given.body_base64), origin);
  if (start.body.record_id !== named) throw new Error(`stream start: the server gave leaf ${given.leaf_index} (${start.body.record_id}) as the stream start, the record names ${named}`);
  const where = `stream start: the record names stream start ${named}`;
  if (start.envelope.kind !== "audit-stream-start/v2") throw new Error(`${where}, which is a ${start.envelope.kind} leaf, not an audit-stream-start/v2`);
  if (!(Number.isSafeInteger(given.leaf_index) && given.leaf_index < evidence.leaf_index)) {
    throw new Error(`${where}, appended at leaf ${given.leaf_index}, after the record at leaf ${evidence.leaf_index}`);
  }
  if (start.body.tenant !== opened.body.tenant) throw new Error(`${where}, which is tenant ${JSON.stringify(start.body.tenant)}'s, not ${JSON.stringify(opened.body.tenant)}'s`);
  const held = (commitments, label) => (Object.prototype.hasOwnProperty.call(commitments, label) ? commitments[label] : null);
  for (const label of ["input", "stop", "user"]) {
    if (held(start.body.commitments, label) !== held(opened.body.commitments, label)) {
      throw new Error(`${where}, whose ${label} commitment is not the record's`);
    }
  }
  return hashLeaf(envelope);
}

function show(number, status, reason) {
  const item = $("check-" + number);
  item.dataset.status = status;
  item.querySelector(".reason").textContent = `${status}: ${visible(reason)}`;
}

// The record this page was asked for: the id in its URL and the leaf index in its link.
function askedFor() {
  const parts = location.pathname.split("/");
  const leaf = new URLSearchParams(location.search).get("leaf");
  return { recordId: decodeURIComponent(parts[parts.length - 1]),
           leafIndex: leaf !== null && /^(0|[1-9][0-9]*)$/.test(leaf) ? Number(leaf) : null };
}

async function verify(evidence, pins) {
  const results = {};
  const set = (n, status, reason) => { results[n] = status; show(n, status, reason); };
  const asked = askedFor();
  const bytes = b64decode(evidence.canonical_base64);
  let body = renderEvidence(evidence, bytes);
  if (!pins.log) {
    for (const n of [1, 2, 3, 4]) set(n, "skipped", "not run: pin the log's verifier key above");
    return verdictOf(results, "not verified: pin the log key to run the checks");
  }

  // Check 1: the bytes are the record asked for and hash to the leaf the log holds.
  const leaf = await hashLeaf(bytes);
  let environmentLeaf = null, startLeaf = null;
  if (evidence.body_base64) {
    try {
      const v2 = await checkLeafV2(evidence, bytes, pins.log.name);
      body = v2.body;
      environmentLeaf = v2.environmentLeaf;
      startLeaf = v2.startLeaf;
      renderSections(body, evidence);
      if (v2.environment) renderEnvironment(v2.environment);
    } catch (err) {
      body = null;
      set(1, "fail", `the v2 leaf does not open: ${err.message}`);
    }
  }
  if (results[1] === "fail") {
    // reported above
  } else if (body === null || typeof body !== "object" || Array.isArray(body)) {
    set(1, "fail", "record bytes are not a JSON object");
  } else if (body.record_id !== asked.recordId) {
    set(1, "fail", `the bytes are record ${JSON.stringify(body.record_id)}, not ${asked.recordId} (the record asked for)`);
  } else if (asked.leafIndex !== null && evidence.leaf_index !== asked.leafIndex) {
    set(1, "fail", `the evidence is for leaf ${evidence.leaf_index}, the record asked for is at leaf ${asked.leafIndex}`);
  } else if (hex(leaf) !== evidence.log_leaf_hash) {
    set(1, "fail", `record bytes hash to ${hex(leaf)}, the log holds ${evidence.log_leaf_hash} at index ${evidence.leaf_index}`);
  } else {
    set(1, "pass", `leaf hash ${hex(leaf)} at index ${evidence.leaf_index}`);
  }

  // Check 3 (before 2 uses the root): the checkpoint's signature under the pinned key.
  let checkpoint = null;
  if (!evidence.checkpoint) {
    set(3, "fail", "the page carries no checkpoint covering this record");
  } else {
    try {
      const opened = await openCheckpoint(evidence.checkpoint, pins.log);
      checkpoint = opened.checkpoint;
      set(3, "pass", `signed by ${pins.log.name}+${hex(pins.log.keyHash)}`);
    } catch (err) {
      set(3, "fail", err.message);
    }
  }

  // Check 2: the proof leads from the leaf to the signed root.
  if (results[1] !== "pass") {
    set(2, "skipped", "not run: check 1 failed");
  } else if (!checkpoint) {
    set(2, "skipped", "not run: the checkpoint's signature (check 3) did not pass, its root is not trusted");
  } else {
    try {
      if (!Array.isArray(evidence.inclusion_proof)) throw new Error("the server gave no inclusion proof");
      if (evidence.tree_size !== checkpoint.size) throw new Error(`proof is for size ${evidence.tree_size}, the checkpoint has ${checkpoint.size}`);
      const root = await rootFromInclusion(leaf, evidence.leaf_index, checkpoint.size, evidence.inclusion_proof.map(unhex));
      if (!equal(root, checkpoint.root)) throw new Error(`calculated root ${hex(root)}, the checkpoint has ${hex(checkpoint.root)}`);
      let where = `leaf ${evidence.leaf_index}`;
      if (environmentLeaf) {
        const e = evidence.environment;
        const envRoot = await rootFromInclusion(environmentLeaf, e.leaf_index, checkpoint.size, e.inclusion_proof.map(unhex));
        if (!equal(envRoot, checkpoint.root)) throw new Error(`the environment leaf's proof leads to ${hex(envRoot)}, the checkpoint has ${hex(checkpoint.root)}`);
        where += ` and its environment leaf ${e.leaf_index}`;
      }
      if (startLeaf) {
        const st = evidence.stream_start;
        const startRoot = await rootFromInclusion(startLeaf, st.leaf_index, checkpoint.size, st.inclusion_proof.map(unhex));
        if (!equal(startRoot, checkpoint.root)) throw new Error(`the stream start leaf's proof leads to ${hex(startRoot)}, the checkpoint has ${hex(checkpoint.root)}`);
        where += ` and its stream start leaf ${st.leaf_index}`;
      }
      set(2, "pass", `${where} in the tree of size ${checkpoint.size}`);
    } catch (err) {
      set(2, "fail", `inclusion proof does not hold: ${err.message}`);
    }
  }

  // Check 4: on the anchored history, and vouched for by someone besides the operator.
  if (results[2] !== "pass" || results[3] !== "pass") {
    set(4, "skipped", "not run: an earlier check failed");
  } else {
    try {
      const reasons = await checkHistory(evidence, checkpoint, pins);
      set(4, "pass", reasons.join("; "));
    } catch (err) {
      set(4, "fail", err.message);
    }
  }
  return verdictOf(results, null);
}

async function checkHistory(evidence, checkpoint, pins) {
  const reasons = [];
  let anchored = null;
  if (evidence.anchored_checkpoint) {
    let opened;
    try {
      opened = await openCheckpoint(evidence.anchored_checkpoint, pins.log);
    } catch (err) {
      throw new Error(`the anchored checkpoint is not authentic: ${err.message}`);
    }
    anchored = opened.checkpoint;
    const [older, newer] = anchored.size <= checkpoint.size ? [anchored, checkpoint] : [checkpoint, anchored];
    if (older.size < newer.size && !Array.isArray(evidence.anchor_consistency)) {
      throw new Error(`no consistency proof between the anchored size ${anchored.size} and size ${checkpoint.size}`);
    }
    await verifyConsistency(older.size, newer.size, (evidence.anchor_consistency || []).map(unhex), older.root, newer.root);
    reasons.push(`consistent with anchored size ${anchored.size} (${evidence.anchor_ref || "no reference"})`);
  }
  if (pins.witnesses.length > 0) {
    const found = await cosigners(evidence.checkpoint, pins.witnesses);
    if (anchored && anchored.size > evidence.leaf_index) {
      for (const name of await cosigners(evidence.anchored_checkpoint, pins.witnesses)) found.add(name);
    }
    const missing = pins.witnesses.map((w) => w.name).filter((n) => !found.has(n));
    if (missing.length > 0) {
      throw new Error(`witness quorum unmet: ${found.size} of ${pins.witnesses.length} pinned witnesses cosigned (missing: ${missing.join(", ")})`);
    }
    reasons.push(`cosigned by ${found.size} of ${pins.witnesses.length} pinned witnesses (${[...found].sort().join(", ")})`);
    return reasons;
  }
  const where = evidence.anchor_ref || "no anchor";
  throw new Error(`self-anchored: the only anchor (${where}) is kept by the operator, who vouches ` +
    "for itself; pin witness keys, or check a Fabric anchor with `audit-ledger verify --fabric-*`");
}

function verdictOf(results, pending) {
  const verdict = $("verdict");
  const failed = [1, 2, 3, 4].find((n) => results[n] === "fail");
  if (pending) {
    verdict.dataset.status = "incomplete";
    verdict.textContent = pending;
  } else if (failed) {
    verdict.dataset.status = "fail";
    verdict.textContent = `NOT verified: check ${failed} failed`;
  } else if ([1, 2, 3, 4].every((n) => results[n] === "pass")) {
    verdict.dataset.status = "pass";
    verdict.textContent = "VERIFIED in this browser: checks 1-4 passed";
  } else {
    verdict.dataset.status = "incomplete";
    verdict.textContent = "not verified: not every check ran";
  }
  $("sections-status").textContent = verdict.dataset.status === "pass"
    ? "verified: these are the bytes checks 1-4 passed on"
    : "NOT verified: shown as the server sent them";
  return results;
}

function renderEvidence(evidence, bytes) {
  const text = new TextDecoder("utf-8").decode(bytes);
  $("canonical").textContent = visible(text);
  $("tree-size").textContent = String(evidence.tree_size);
  $("log-leaf").textContent = String(evidence.log_leaf_hash);
  const proof = $("proof");
  proof.replaceChildren(...(evidence.inclusion_proof || []).map((h) => {
    const li = document.createElement("li"); li.textContent = visible(h); return li;
  }));
  $("checkpoint").textContent = visible(evidence.checkpoint || "(none)");
  $("anchored-checkpoint").textContent = visible(evidence.anchored_checkpoint || "(none)");
  const lines = $("signature-lines");
  lines.replaceChildren();
  try {
    for (const s of parseNote(evidence.checkpoint || "").lines) {
      const li = document.createElement("li");
      li.textContent = visible(`${s.name} key hash ${hex(s.keyHash)}`);
      lines.append(li);
    }
  } catch (err) { /* a malformed note is reported by check 3 */ }
  let body = null;
  try { body = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes)); } catch (err) { body = null; }
  renderSections(body, evidence);
  return body;
}

function kvTable(section, rows) {
  const table = document.createElement("table");
  table.className = "kv";
  table.dataset.section = section;
  for (const [k, v] of rows) {
    const tr = document.createElement("tr");
    const th = document.createElement("th"); th.textContent = visible(k);
    const td = document.createElement("td"); td.textContent = visible(v);
    tr.append(th, td); table.append(tr);
  }
  return table;
}

function renderEnvironment(body) {
  const holder = $("sections");
  const title = document.createElement("h3");
  title.textContent = "environment leaf";
  const rows = [];
  const walk = (prefix, v) => {
    if (v !== null && typeof v === "object" && !Array.isArray(v)) {
      for (const [k, inner] of Object.entries(v)) walk(prefix ? `${prefix}.${k}` : k, inner);
      return;
    }
    rows.push([prefix, JSON.stringify(v)]);
  };
  walk("", body);
  holder.append(title, kvTable("environment-leaf", rows));
}

// The record's identity and sections as tables of dotted paths, from the bytes themselves.
function renderSections(body, evidence) {
  const holder = $("sections");
  holder.replaceChildren();
  if (body === null || typeof body !== "object") return;
  const h = document.createElement("h3");
  h.textContent = "identity";
  holder.append(h, kvTable("identity", [
    ["record_id", String(body.record_id)], ["leaf_index", String(evidence.leaf_index)],
    ["created_at", String(body.created_at)], ["tenant", String(body.tenant)],
    ["schema", String(body.schema)]]));
  for (const [section, value] of Object.entries(body)) {
    if (value === null || typeof value !== "object") continue;
    const rows = [];
    const walk = (prefix, v) => {
      if (v !== null && typeof v === "object" && !Array.isArray(v)) {
        for (const [k, inner] of Object.entries(v)) walk(prefix ? `${prefix}.${k}` : k, inner);
        return;
      }
      rows.push([prefix, JSON.stringify(v)]);
    };
    walk("", value);
    const title = document.createElement("h3");
    title.textContent = visible(section);
    holder.append(title, kvTable(section, rows));
  }
}

// --- pinned keys: kept for this browser session (every tab), gone when it closes ------

function pinSession() {
  const m = document.cookie.split("; ").find((c) => c.startsWith(PIN_COOKIE + "="));
  return m ? m.slice(PIN_COOKIE.length + 1) : null;
}

function savePins(logText, witnessTexts) {
  let session = pinSession();
  if (!session) {
    session = hex(crypto.getRandomValues(new Uint8Array(16)));
    // No Max-Age: the browser drops it when its session ends, and with it the pins.
    document.cookie = `${PIN_COOKIE}=${session}; path=/; SameSite=Strict`;
  }
  localStorage.setItem(PIN_STORAGE, JSON.stringify({ session, log: logText, witnesses: witnessTexts }));
}

function forgetPins() {
  localStorage.removeItem(PIN_STORAGE);
}

async function pinnedKeys() {
  const none = { log: null, witnesses: [] };
  let saved;
  try { saved = JSON.parse(localStorage.getItem(PIN_STORAGE) || "null"); } catch (err) { saved = null; }
  if (!saved || saved.session !== pinSession()) { forgetPins(); return none; }
  try {
    return { log: await decodeVerifierKey(saved.log),
             witnesses: await Promise.all((saved.witnesses || []).map(decodeWitnessKey)) };
  } catch (err) {
    forgetPins();
    return none;
  }
}

async function run() {
  const verdict = $("verdict");
  if (!window.crypto || !crypto.subtle) {
    verdict.dataset.status = "fail";
    verdict.textContent = "WebCrypto is unavailable: open the console over HTTPS (or loopback)";
    return;
  }
  const pins = await pinnedKeys();
  $("pinned-key").textContent = pins.log ? pins.log.text : "none";
  $("pinned-witnesses").textContent = pins.witnesses.length ? pins.witnesses.map((w) => w.text).join("\n") : "none";
  try {
    await verify(JSON.parse($("evidence").textContent), pins);
  } catch (err) {
    // Evidence this page cannot even read is a failure, never a pass.
    verdict.dataset.status = "fail";
    verdict.textContent = `NOT verified: the page's evidence is malformed (${err.message})`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("pin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const witnessTexts = $("pin-witnesses").value.split("\n").map((l) => l.trim()).filter((l) => l);
    try {
      const log = await decodeVerifierKey($("pin-key").value);
      const witnesses = await Promise.all(witnessTexts.map(decodeWitnessKey));
      if (new Set(witnesses.map((w) => w.name)).size !== witnesses.length) throw new Error("the same witness name is given twice");
      if (new Set(witnesses.map((w) => hex(w.keyHash))).size !== witnesses.length) throw new Error("the same witness key is given twice");
      savePins(log.text, witnesses.map((w) => w.text));
    } catch (err) {
      $("pinned-key").textContent = `not pinned: ${err.message}`;
      return;
    }
    await run();
  });
  $("unpin-button").addEventListener("click", async () => {
    forgetPins();
    await run();
  });
  run();
});
