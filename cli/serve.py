"""``ckpt serve``: a live page of one or several stores, redrawn in the browser as results land.

matplotlib and the server are imported inside the command, never at registration, so that
``ckpt --help`` and the commands that do not draw do not load them.
"""

from __future__ import annotations

import click

from ckpt.cli.analyze import expand_stores, registry


@click.command("serve")
@click.argument("stores", metavar="STORE...", nargs=-1, required=True)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. The default serves this machine only; 0.0.0.0 serves every network the "
    "machine is on (the page has no login: anyone who can reach it sees the runs).",
)
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=8765,
    show_default=True,
    help="Port to listen on; 0 picks a free one (the URL printed says which).",
)
def serve_command(stores: tuple[str, ...], host: str, port: int) -> None:
    """Serve a live page of the figures and tables of STORE (several: side by side) until Ctrl-C.

    The page shows what ckpt report shows of each store's results (their figures, summaries and
    provenance), the metrics and the latest checkpoints, and, with several stores (runs/*.zarr,
    e.g. seeds), their loss and gradient norms overlaid. It redraws a figure, without reloading,
    within a few seconds of its result changing: run ckpt analyze (or a follower) beside it as
    checkpoints land. The server only reads the stores (it never writes to them) and serves
    nothing but the page it generates.
    """
    import ckpt.store as ckptstore
    from ckpt.cli.live_server import Live, make_server
    from ckpt.store.results import threads_unless_configured

    paths = expand_stores(stores)
    for path in paths:
        ckptstore.open(path)  # refuses a missing path or a folder that is no store, before serving
    try:
        server = make_server(Live(paths, registry()), host, port)
    except OSError as exc:
        msg = f"cannot listen on {host}:{port} ({exc.strerror or exc}): choose another --port, or 0 for a free one"
        raise click.ClickException(msg) from None
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"serving {len(paths)} store(s) at http://{shown}:{bound}/ (Ctrl-C stops)")
    with threads_unless_configured(), server:
        try:
            server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            click.echo("stopped")


__all__ = ["serve_command"]
