"""greenroom's command line: serve, worker, ps, demo-model, convert."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import urllib.error
import urllib.request

from greenroom import __version__
from greenroom.config import load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="greenroom", description="A workstation LLM server.")
    parser.add_argument("--version", action="version", version=f"greenroom {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="start the actor tree and the HTTP front end")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument(
        "--config",
        help="a TOML config file, over configs/default.toml (or in place of it, with defaults = false in it)",
    )
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--no-extras", action="store_true", help="leave the x_needle block out of chat completions")
    p.add_argument(
        "--continuous-batching",
        action="store_true",
        default=None,
        help="batch requests that use the fixed sampling parameters (see GET /api/health/inference)",
    )

    p = sub.add_parser(
        "worker",
        help="offer this host's engine actors to a main host's tree (GREENROOM_WORKER_TOKEN set on both)",
    )
    p.add_argument("--join", required=True, metavar="HOST:PORT", help="the main host's workers_listen address")
    p.add_argument("--name", help="this host's name in the tree (default: its hostname)")
    p.add_argument(
        "--actors", help="engine actors to offer, comma-separated (default: one per CUDA card, else cpu; and npu0…)"
    )
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        help="the loopback address this host's actors listen on (default 127.0.0.1); never a network one",
    )
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")

    p = sub.add_parser("ps", help="print a running server's URLs and uptime, its actor tree and its models")
    p.add_argument(
        "--url", default=None, help="server URL (default: http://127.0.0.1:8000; the scheme may be left out)"
    )
    p.add_argument("--json", action="store_true", help="print GET /api/actors and GET /api/models as JSON")
    p.add_argument(
        "--api-key", default=None, help="the server's API key (default: $GREENROOM_API_KEY or $NEEDLE_API_KEY)"
    )

    p = sub.add_parser(
        "demo-model",
        help="build the demo checkpoint, its two SAEs and, for float32 sizes, its "
        "GGUF files and OpenVINO IR (deterministic, no download)",
    )
    p.add_argument("--size", default="tiny", help="tiny (default), 100m or 1b")
    p.add_argument("--cache-dir", default=None, help="cache root (default: $GREENROOM_CACHE or ~/.cache/greenroom)")

    p = sub.add_parser(
        "convert",
        help="export a Hugging Face checkpoint directory to an OpenVINO model "
        'directory (source of an engine = "openvino" model); with --from-gguf, turn a GGUF '
        "file into a Hugging Face checkpoint directory (float32, for the transformers engine); "
        "with --to-gguf, write a BERT embedding checkpoint (BertModel) as an F16 GGUF file (for llama.cpp)",
    )
    p.add_argument("--from-gguf", metavar="FILE", help="a GGUF file to dequantise into OUT")
    p.add_argument("--to-gguf", action="store_true", help="write CHECKPOINT as the GGUF file OUT")
    p.add_argument("checkpoint", nargs="?", help="a Hugging Face checkpoint directory (not with --from-gguf)")
    p.add_argument("out", help="the directory to write (with --to-gguf: the file)")

    args = parser.parse_args(argv)
    if args.command == "convert" and (
        (args.checkpoint is None) == (args.from_gguf is None) or (args.to_gguf and args.from_gguf)
    ):
        parser.error("convert takes CHECKPOINT OUT, --to-gguf CHECKPOINT OUT, or --from-gguf FILE OUT")
    return {"serve": _serve, "worker": _worker, "ps": _ps, "demo-model": _demo_model, "convert": _convert}[
        args.command
    ](args)


def _serve(args) -> int:
    import trio

    from greenroom.supervisor.serve import serve

    try:
        config = load_config(
            args.config,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            expose_extras=False if args.no_extras else None,
            continuous_batching=args.continuous_batching,
        )
    except ValueError as exc:  # a bad file, key or variable: what is wrong, not a traceback
        print(f"greenroom serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    trio.run(serve, config)
    return 0


def _worker(args) -> int:
    import ipaddress
    import socket

    import trio

    from greenroom.config import detect_engine_actors, detect_npu_actors
    from greenroom.hosts.tls import TokenError, token_from_env
    from greenroom.hosts.worker import WorkerHost, run_worker

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = args.join.rpartition(":")
    if not host or not port.isdigit():
        print(f"greenroom worker: --join takes HOST:PORT, not {args.join!r}", file=sys.stderr)
        return 2
    try:
        token = token_from_env()
        if not ipaddress.ip_address(args.bind).is_loopback:
            raise ValueError(
                f"--bind {args.bind}: this host's actors run whatever an unauthenticated peer of their "
                "port asks (tractor checks nothing); they listen on a loopback address only"
            )
    except (TokenError, ValueError) as exc:
        print(f"greenroom worker: {exc}", file=sys.stderr)
        return 2
    actors = [a.strip() for a in args.actors.split(",") if a.strip()] if args.actors else None
    actors = actors or detect_engine_actors() + detect_npu_actors()
    name = args.name or socket.gethostname().split(".")[0]
    worker = WorkerHost((host.strip("[]"), int(port)), name, actors, args.bind, token, args.log_level)
    return trio.run(run_worker, worker)


def _ps(args) -> int:
    url = (args.url or "http://127.0.0.1:8000").rstrip("/")
    url = url if "://" in url else "http://" + url  # 127.0.0.1:8000, as the server's log says it
    key = args.api_key or os.environ.get("GREENROOM_API_KEY") or os.environ.get("NEEDLE_API_KEY")
    try:
        tree = _get(url + "/api/actors", key)
        models = _get(url + "/api/models", key)["models"]
    except urllib.error.HTTPError as exc:
        print(f"greenroom ps: {exc.url} answered {exc.code}: {exc.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"greenroom ps: no server answered at {url}: {exc}", file=sys.stderr)
        return 1
    actors, server = tree["actors"], tree["server"]
    if args.json:
        print(json.dumps({"server": server, "actors": actors, "models": models}, indent=2))
        return 0
    print(
        f"greenroom {server['version']} (pid {server['pid']}) on {', '.join(server['listening']) or url}, "
        f"up {_duration(server['uptime_s'])}\n"
    )
    width = max(12, *(len(a["name"]) for a in actors))  # GGUF actors are named after their model
    hosts = max(4, *(len(a.get("host") or "-") for a in actors))
    print(
        f"{'NAME':<{width}} {'HOST':<{hosts}} {'PID':>8} {'STATE':<12} {'QUEUE':>5} {'RSS MB':>8} {'RESTARTS':>8}  MODELS"
    )
    for a in actors:
        rss = f"{a['rss_bytes'] / 2**20:.0f}" if a.get("rss_bytes") else "-"
        print(
            f"{a['name']:<{width}} {a.get('host') or '-':<{hosts}} {a['pid'] or '-':>8} {a['state']:<12} "
            f"{a['queue_depth']:>5} {rss:>8} {a.get('restarts', 0):>8}  {','.join(a['models']) or '-'}"
        )
    # every configured model, loaded or not: the state a request for it finds
    width = max(12, *(len(m["id"]) for m in models)) if models else 12
    print(f"\n{'MODEL':<{width}} {'STATE':<11} {'ENGINE':<12} {'SIZE MB':>8} ACTOR")
    for m in models:
        size = f"{m['footprint_bytes'] / 2**20:.0f}" if m.get("footprint_bytes") else "-"  # loaded: its footprint
        print(f"{m['id']:<{width}} {m['state']:<11} {m['engine']:<12} {size:>8} {m['actor']}")
    limits, gib = server["limits"], 2**30
    budget = limits["memory_budget_bytes"]
    print(
        f"\nswap: max_loaded_models {limits['max_loaded_models'] or 'unlimited'}, memory_budget "
        f"{f'{budget / gib:.1f} GiB' if budget else 'available memory'}, evict_pinned "
        f"{str(limits['evict_pinned']).lower()}, gguf_parallel {limits['gguf_parallel']}, max_queue {limits['max_queue']}"
    )
    for d in server["devices"]:
        where = f"{d['host']}/{d['device']}" if d["host"] else d["device"]
        print(f"{where}: {len(d['models'])} loaded, {d['bytes'] / gib:.2f} GiB ({', '.join(d['models'])})")
    errors = [a for a in actors if a.get("last_error")]
    if errors:
        print("\nLAST ERRORS")
        for a in errors:
            print(f"{a['name']}: {a['last_error']}")
    return 0


def _get(url: str, key: str | None) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def _duration(seconds: float) -> str:
    """3d 4h, 2h 03m, 5m 12s, 42s."""
    s = int(seconds)
    for unit, size, sub_unit, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit} {s % size // sub_size:02d}{sub_unit}"
    return f"{s}s"


def _convert(args) -> int:
    """optimum-cli when it is installed (any architecture it knows; keep it in an environment
    of its own: it pins transformers below 5.6); else greenroom's own Llama exporter."""
    import shutil
    import subprocess
    from pathlib import Path

    out = Path(args.out).expanduser()
    if args.to_gguf:
        return _convert_to_gguf(Path(args.checkpoint).expanduser(), out)
    if out.exists() and any(out.iterdir()):
        print(f"greenroom convert: {out} exists and is not empty", file=sys.stderr)
        return 2
    if args.from_gguf:
        return _convert_gguf(Path(args.from_gguf).expanduser(), out)
    src = Path(args.checkpoint).expanduser()
    optimum = shutil.which("optimum-cli")
    if optimum:
        print(f"exporting with {optimum}")
        return subprocess.call(
            [optimum, "export", "openvino", "--model", str(src), "--task", "text-generation-with-past", str(out)]
        )
    from greenroom.engines.demo.demo_openvino import export_llama

    print("optimum-cli is not installed: exporting with greenroom's Llama exporter (LlamaForCausalLM only)")
    try:
        export_llama(src, out)
    except (OSError, ValueError, KeyError) as exc:
        print(f"greenroom convert: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def _convert_gguf(gguf_file, out) -> int:
    """The transformers engine's converter (engines/llama_cpp/gguf_convert.py), written beside OUT and
    renamed into place, so a failed conversion leaves nothing behind."""
    import shutil
    import tempfile
    from pathlib import Path

    from greenroom.engines.llama_cpp.gguf_convert import convert_gguf

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        convert_gguf(gguf_file, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if out.exists():
            out.rmdir()  # empty, checked above
        os.rename(tmp, out)
    except (OSError, ValueError) as exc:
        print(f"greenroom convert: {gguf_file}: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(out)
    return 0


def _convert_to_gguf(checkpoint, out) -> int:
    """The `gguf-from:` source's writer (engines/llama_cpp/bert_gguf.py), written beside OUT and
    renamed into place: a failed conversion leaves nothing behind, and OUT is never overwritten."""
    import tempfile
    from pathlib import Path

    from greenroom.engines.llama_cpp.bert_gguf import write_bert_gguf

    if out.exists():
        print(f"greenroom convert: {out} exists", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        write_bert_gguf(checkpoint, tmp)
        os.rename(tmp, out)
    except (OSError, ValueError) as exc:
        print(f"greenroom convert: {checkpoint}: {exc}", file=sys.stderr)
        return 2
    finally:
        Path(tmp).unlink(missing_ok=True)
    print(out)
    return 0


def _demo_model(args) -> int:
    from greenroom.engines.demo.demo_gguf import QUANTS, ensure_demo_gguf
    from greenroom.engines.demo.demo_model import SIZES, default_cache_dir, ensure_demo_model
    from greenroom.engines.demo.demo_openvino import ensure_demo_openvino
    from greenroom.engines.demo.demo_sae import demo_sae_layers, ensure_demo_sae

    cache = default_cache_dir(args.cache_dir)
    print(ensure_demo_model(cache, args.size))
    for layer in demo_sae_layers(args.size):
        print(ensure_demo_sae(cache, args.size, layer))
    if SIZES.get(args.size, {}).get("dtype") == "float32":  # the converter reads float32 weights
        for quant in QUANTS:
            print(ensure_demo_gguf(cache, quant, args.size))
        print(ensure_demo_openvino(cache, args.size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
