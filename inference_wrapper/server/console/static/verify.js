// In-browser verification of one audit record. Inputs: the evidence block the server put
// in the page and a log key the auditor pinned in this tab. No verdict comes from the
// server: every hash and the signature are computed here with WebCrypto.
//   1. SHA-256(0x00 || canonical bytes) equals the leaf hash the log holds (RFC 9162 2.1.1)
//   2. the inclusion proof leads from that leaf to the checkpoint's root (RFC 9162 2.1.3.2)
//   3. the checkpoint note carries a valid Ed25519 signature by the pinned key (signed-note)
//   4. consistency with the anchor: not checked in the browser (use `audit-ledger verify`)
// Check 3 runs before check 2 uses the root: an unsigned root is not trusted.
"use strict";

const PIN_STORAGE = "audit-ledger.pinned-log-key";
const enc = new TextEncoder();

function $(id) { return document.getElementById(id); }

function b64decode(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function unhex(text) {
  if (!/^([0-9a-f]{2})*$/.test(text)) throw new Error("not lowercase hex: " + text);
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

// A signed-note verifier key: name+hex(key hash)+base64(0x01 || Ed25519 public key).
async function decodeVerifierKey(text) {
  // The name has no "+"; the base64 key may, so split at the first two only.
  const trimmed = text.trim();
  const first = trimmed.indexOf("+"), second = trimmed.indexOf("+", first + 1);
  if (first <= 0 || second < 0) throw new Error("a verifier key is name+hash+key");
  const name = trimmed.slice(0, first), hashHex = trimmed.slice(first + 1, second);
  const keyB64 = trimmed.slice(second + 1);
  const raw = b64decode(keyB64);
  if (raw.length !== 33 || raw[0] !== 1) throw new Error("only Ed25519 verifier keys are supported");
  const pub = raw.slice(1);
  const keyHash = (await sha256(concat(enc.encode(name + "\n"), new Uint8Array([1]), pub))).slice(0, 4);
  if (hex(keyHash) !== hashHex) throw new Error("the key hash does not match the key");
  const key = await crypto.subtle.importKey("raw", pub, { name: "Ed25519" }, false, ["verify"]);
  return { name, keyHash, key, text: trimmed };
}

// Body and signature lines of a signed note; the body ends with its last newline.
function parseNote(text) {
  const split = text.lastIndexOf("\n\n");
  if (split < 0 || !text.endsWith("\n")) throw new Error("not a signed note");
  const body = text.slice(0, split + 1);
  const lines = text.slice(split + 2, -1).split("\n").map((line) => {
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

function show(number, status, reason) {
  const item = $("check-" + number);
  item.dataset.status = status;
  item.querySelector(".reason").textContent = `${status}: ${reason}`;
}

async function verify(evidence, pinned) {
  const results = {};
  const set = (n, status, reason) => { results[n] = status; show(n, status, reason); };
  const bytes = b64decode(evidence.canonical_base64);
  renderEvidence(evidence, bytes);

  // Check 1: the bytes are this record and hash to the leaf the log holds.
  const leaf = await hashLeaf(bytes);
  try {
    const body = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
    if (body === null || typeof body !== "object" || body.record_id !== evidence.record_id) {
      set(1, "fail", `the bytes are record ${JSON.stringify(body && body.record_id)}, not ${evidence.record_id}`);
    } else if (hex(leaf) !== evidence.log_leaf_hash) {
      set(1, "fail", `record bytes hash to ${hex(leaf)}, the log holds ${evidence.log_leaf_hash} at index ${evidence.leaf_index}`);
    } else {
      set(1, "pass", `leaf hash ${hex(leaf)} at index ${evidence.leaf_index}`);
    }
  } catch (err) {
    set(1, "fail", `record bytes are not JSON: ${err.message}`);
  }

  // Check 3 (before 2 uses the root): the checkpoint's signature under the pinned key.
  let checkpoint = null;
  if (!evidence.checkpoint) {
    set(3, "fail", "the page carries no checkpoint covering this record");
  } else if (!pinned) {
    set(3, "skipped", "not run: pin the log's verifier key above");
  } else {
    try {
      const note = parseNote(evidence.checkpoint);
      const mine = note.lines.filter((s) => s.name === pinned.name && equal(s.keyHash, pinned.keyHash));
      if (mine.length === 0) {
        set(3, "fail", `note carries no signature by key ${pinned.name}+${hex(pinned.keyHash)}`);
      } else {
        let valid = false;
        for (const s of mine) {
          valid = valid || await crypto.subtle.verify({ name: "Ed25519" }, pinned.key, s.signature, enc.encode(note.body));
        }
        if (!valid) {
          set(3, "fail", `signature by key ${pinned.name} does not verify`);
        } else {
          checkpoint = parseCheckpointBody(note.body);
          if (checkpoint.origin !== pinned.name) {
            set(3, "fail", `checkpoint is for origin ${checkpoint.origin}, the pinned key is ${pinned.name}`);
            checkpoint = null;
          } else {
            const others = note.lines.length - mine.length;
            set(3, "pass", `signed by ${pinned.name}+${hex(pinned.keyHash)}` +
              (others ? `; ${others} other signature line(s) (cosignatures) not checked here` : ""));
          }
        }
      }
    } catch (err) {
      set(3, "fail", `checkpoint note is malformed: ${err.message}`);
    }
  }

  // Check 2: the proof leads from the leaf to the signed root.
  if (results[1] !== "pass") {
    set(2, "skipped", "not run: check 1 failed");
  } else if (!checkpoint) {
    set(2, "skipped", "not run: the checkpoint's signature (check 3) did not pass, its root is not trusted");
  } else {
    try {
      if (evidence.tree_size !== checkpoint.size) throw new Error(`proof is for size ${evidence.tree_size}, the checkpoint has ${checkpoint.size}`);
      const root = await rootFromInclusion(leaf, evidence.leaf_index, checkpoint.size, evidence.inclusion_proof.map(unhex));
      if (!equal(root, checkpoint.root)) throw new Error(`calculated root ${hex(root)}, the checkpoint has ${hex(checkpoint.root)}`);
      set(2, "pass", `leaf ${evidence.leaf_index} is in the tree of size ${checkpoint.size}`);
    } catch (err) {
      set(2, "fail", `inclusion proof does not hold: ${err.message}`);
    }
  }

  set(4, "not-checked", "not checked in the browser (anchor " +
    (evidence.anchor_ref || "not yet recorded") + "); run `audit-ledger verify` for it");

  const failed = [1, 2, 3].find((n) => results[n] === "fail");
  const verdict = $("verdict");
  if (failed) {
    verdict.dataset.status = "fail";
    verdict.textContent = `NOT verified: check ${failed} failed`;
  } else if ([1, 2, 3].every((n) => results[n] === "pass")) {
    verdict.dataset.status = "pass";
    verdict.textContent = "checks 1-3 passed in this browser";
  } else {
    verdict.dataset.status = "incomplete";
    verdict.textContent = "not verified: pin the log key to run every check";
  }
}

function renderEvidence(evidence, bytes) {
  const text = new TextDecoder("utf-8").decode(bytes);
  $("canonical").textContent = text;
  $("tree-size").textContent = String(evidence.tree_size);
  $("log-leaf").textContent = evidence.log_leaf_hash;
  const proof = $("proof");
  proof.replaceChildren(...evidence.inclusion_proof.map((h) => {
    const li = document.createElement("li"); li.textContent = h; return li;
  }));
  $("checkpoint").textContent = evidence.checkpoint || "(none)";
  const lines = $("signature-lines");
  lines.replaceChildren();
  try {
    for (const s of parseNote(evidence.checkpoint || "").lines) {
      const li = document.createElement("li");
      li.textContent = `${s.name} key hash ${hex(s.keyHash)}`;
      lines.append(li);
    }
  } catch (err) { /* a malformed note is reported by check 3 */ }
  renderSections(text);
}

// The record's sections as tables of dotted paths, from the bytes that were checked.
function renderSections(text) {
  let body;
  try { body = JSON.parse(text); } catch (err) { return; }
  const holder = $("sections");
  holder.replaceChildren();
  for (const [section, value] of Object.entries(body)) {
    if (value === null || typeof value !== "object") continue;
    const h = document.createElement("h3");
    h.textContent = section;
    const table = document.createElement("table");
    table.className = "kv";
    table.dataset.section = section;
    const walk = (prefix, v) => {
      if (v !== null && typeof v === "object" && !Array.isArray(v)) {
        for (const [k, inner] of Object.entries(v)) walk(prefix ? `${prefix}.${k}` : k, inner);
        return;
      }
      const tr = document.createElement("tr");
      const th = document.createElement("th"); th.textContent = prefix;
      const td = document.createElement("td"); td.textContent = JSON.stringify(v);
      tr.append(th, td); table.append(tr);
    };
    walk("", value);
    holder.append(h, table);
  }
}

async function pinnedKey() {
  const text = sessionStorage.getItem(PIN_STORAGE);
  if (!text) return null;
  try {
    return await decodeVerifierKey(text);
  } catch (err) {
    sessionStorage.removeItem(PIN_STORAGE);
    return null;
  }
}

async function run() {
  const verdict = $("verdict");
  if (!window.crypto || !crypto.subtle) {
    verdict.dataset.status = "fail";
    verdict.textContent = "WebCrypto is unavailable: open the console over HTTPS (or loopback)";
    return;
  }
  const pinned = await pinnedKey();
  $("pinned-key").textContent = pinned ? pinned.text : "none";
  try {
    await verify(JSON.parse($("evidence").textContent), pinned);
  } catch (err) {
    // Evidence this page cannot even read is a failure, never a pass.
    verdict.dataset.status = "fail";
    verdict.textContent = `NOT verified: the page's evidence is malformed (${err.message})`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("pin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const key = await decodeVerifierKey($("pin-key").value);
      sessionStorage.setItem(PIN_STORAGE, key.text);
    } catch (err) {
      $("pinned-key").textContent = `not pinned: ${err.message}`;
      return;
    }
    await run();
  });
  $("unpin-button").addEventListener("click", async () => {
    sessionStorage.removeItem(PIN_STORAGE);
    await run();
  });
  run();
});
