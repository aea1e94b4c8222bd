"""``delayq protocol``: the protocol other languages' producers follow (docs/protocol.md)."""

from __future__ import annotations

import click

from delayq.protocol.export import export as write_export
from delayq.protocol.version import PROTOCOL_VERSION


@click.group()
def protocol() -> None:
    """The protocol producers in other languages follow (docs/protocol.md)."""


@protocol.command("export")
@click.argument("directory", type=click.Path(file_okay=False, writable=True))
def export(directory: str) -> None:
    """Write the producer's scripts, exactly as delayq runs them, and manifest.json."""
    try:
        paths = write_export(directory)
    except OSError as e:
        raise click.ClickException(f"cannot write to {directory}: {e}") from None
    click.echo(
        f"wrote {len(paths) - 1} scripts and {paths[-1].name} (protocol {PROTOCOL_VERSION}) "
        f"to {directory}"
    )
