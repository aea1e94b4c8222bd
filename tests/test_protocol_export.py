"""``delayq protocol export``: the scripts as delayq runs them (the server computes the same
SHA-1), a manifest that says what their headers say, and the Node client's committed copy
equal to a fresh export."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import redis
from click.testing import CliRunner

from delayq.cli.main import main
from delayq.embedded import EmbeddedServer
from delayq.keys import QueueKeys
from delayq.protocol.export import MANIFEST, PRODUCER_SCRIPTS, export
from delayq.protocol.version import PROTOCOL_VERSION
from delayq.scripts import SCRIPTS, file_of, parse_header, parse_reply

ROOT = Path(__file__).resolve().parent.parent
NODE_COPY = ROOT / "clients" / "node" / "protocol"


def _exported(tmp_path: Path) -> tuple[Path, dict]:  # type: ignore[type-arg]
    result = CliRunner().invoke(main, ["protocol", "export", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert f"wrote 8 scripts and manifest.json (protocol {PROTOCOL_VERSION})" in result.output
    out = tmp_path / "out"
    return out, json.loads((out / MANIFEST).read_text(encoding="utf-8"))


def test_the_exported_scripts_are_what_the_server_loads(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    out, manifest = _exported(tmp_path)
    assert [s["name"] for s in manifest["scripts"]] == list(PRODUCER_SCRIPTS)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MANIFEST, *(f"{n}.lua" for n in PRODUCER_SCRIPTS)]
    )
    r = redis.Redis.from_url(server.url)
    try:
        for entry in manifest["scripts"]:
            body = (out / entry["file"]).read_bytes()
            assert body == SCRIPTS[entry["name"]].source.encode()  # byte for byte
            assert r.script_load(body) == entry["sha1"] == SCRIPTS[entry["name"]].sha
    finally:
        r.close()


def test_the_manifest_says_what_each_scripts_header_declares(tmp_path: Path) -> None:
    _, manifest = _exported(tmp_path)
    assert manifest["protocol"] == PROTOCOL_VERSION and manifest["default_prefix"] == "dq"
    keys = QueueKeys("orders")
    for attribute, suffix in manifest["keys"].items():  # the layout the keys module spells
        assert getattr(keys, attribute) == f"dq:{{orders}}:{suffix}"
    for entry in manifest["scripts"]:
        name = entry["name"]
        text = resources.files("delayq").joinpath("lua", file_of(name)).read_text("utf-8")
        key_names, arg_names, variadic = parse_header(name, text)
        assert entry["keys"] == list(key_names) and entry["argv"] == list(arg_names)
        assert entry["variadic"] == variadic
        assert set(entry["keys"]) <= set(manifest["keys"])
        reply = parse_reply(name, text)
        layout = entry["reply"]
        assert layout["text"] == reply.text and layout["scalars"] == list(reply.scalars)
        if reply.array:
            assert layout["array"] == {
                "head": list(reply.heads),
                "per": reply.per,
                "row": list(reply.row),
                "tail": list(reply.tails),
            }
        else:
            assert layout["array"] is None
    by_name = {s["name"]: s for s in manifest["scripts"]}
    assert by_name["schedule"]["variadic"] == "tasks"
    assert by_name["schedule"]["reply"]["array"]["row"] == ["status"]
    assert by_name["shards"]["argv"] == ["want", "store", "protocol"]
    assert by_name["get"]["reply"]["scalars"] == ["nil"]


def test_an_export_over_an_earlier_one_leaves_the_same_files(tmp_path: Path) -> None:
    first = {p.name: p.read_bytes() for p in export(tmp_path)}
    second = {p.name: p.read_bytes() for p in export(tmp_path)}
    assert first == second


def test_the_node_clients_copy_is_a_fresh_export(tmp_path: Path) -> None:
    fresh = {p.name: p.read_bytes() for p in export(tmp_path)}
    committed = {p.name: p.read_bytes() for p in NODE_COPY.iterdir()}
    stale = sorted(n for n in fresh.keys() | committed.keys() if fresh.get(n) != committed.get(n))
    assert stale == [], (
        f"clients/node/protocol differs from a fresh export in {stale}: run "
        "`python -m delayq protocol export clients/node/protocol` and commit the result"
    )
