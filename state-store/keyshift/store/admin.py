"""``keyshift store ...``: inspect, back up, restore and delete a job's state,
and the store's self-check.

The store is named by ``--url`` or ``$KEYSHIFT_STORE_URL``; a password comes
from ``--password-file`` or ``$KEYSHIFT_STORE_PASSWORD``, never from the URL. A TLS
store with its own CA (the chart's managed Valkey with TLS) is verified with
``--ca-file`` or ``$KEYSHIFT_STORE_CA_FILE`` (the ``ca.crt`` of the store's Secret).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from keyshift.store.client import open_store
from keyshift.store.migrate import Kind, LayoutError, migrate_entries
from keyshift.store.protocol import Assignment, Fenced, StateStore
from keyshift.store.redis_backend import RedisStateStore
from keyshift.store.savepoint import SavepointSummary, export_job, import_job
from keyshift.store.server import LocalServer

console = Console()

Transfer = Callable[
    [StateStore, str, Path, Callable[[int, int], None]], Awaitable[SavepointSummary]
]


def add_store_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    store = subparsers.add_parser("store", help="inspect and manage the remote state store")
    commands = store.add_subparsers(dest="store_command", required=True)

    def with_store(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--url", default=os.environ.get("KEYSHIFT_STORE_URL"), help="store URL")
        p.add_argument("--password-file", type=Path, help="file holding the store password")
        _ca_option(p)
        return p

    check = commands.add_parser(
        "selfcheck", help="run the store's fencing and handoff checks (embedded Valkey if no --url)"
    )
    check.add_argument("--url", default=None, help="check this store instead of an embedded one")
    check.add_argument("--password-file", type=Path)
    _ca_option(check)
    check.set_defaults(handler=_selfcheck)

    listing = with_store(commands.add_parser("list", help="a job's key groups"))
    listing.add_argument("job")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=_list)

    export = with_store(
        commands.add_parser("export", help="write a job's state to a savepoint file")
    )
    export.add_argument("job")
    export.add_argument("file", type=Path)
    export.set_defaults(handler=_export)

    load = with_store(commands.add_parser("import", help="load a savepoint file as a job"))
    load.add_argument("job")
    load.add_argument("file", type=Path)
    load.set_defaults(handler=_import)

    migrate = with_store(
        commands.add_parser(
            "migrate-entries",
            help="convert map and list states to the per-entry layout (with the job stopped)",
        )
    )
    migrate.add_argument("job")
    migrate.add_argument(
        "--map", action="append", default=[], metavar="STATE", help="a MapState's name"
    )
    migrate.add_argument(
        "--list", action="append", default=[], metavar="STATE", help="a ListState's name"
    )
    migrate.add_argument(
        "--force", action="store_true",
        help=f"migrate although a worker of the job was alive in the last {ALIVE_SECONDS:.0f} s",
    )  # fmt: skip
    migrate.set_defaults(handler=_migrate)

    delete = with_store(commands.add_parser("delete", help="delete all of a job's state"))
    delete.add_argument("job")
    delete.add_argument("--yes", action="store_true", help="confirm: this cannot be undone")
    delete.add_argument(
        "--force", action="store_true",
        help=f"delete although a worker of the job was alive in the last {ALIVE_SECONDS:.0f} s",
    )  # fmt: skip
    delete.set_defaults(handler=_delete)


def _ca_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ca-file", default=os.environ.get("KEYSHIFT_STORE_CA_FILE"),
        help="CA (PEM) of a TLS store's certificate (or KEYSHIFT_STORE_CA_FILE)",
    )  # fmt: skip


def _password(args: argparse.Namespace) -> str | None:
    if args.password_file is not None:
        return str(Path(args.password_file).read_text().strip())
    return os.environ.get("KEYSHIFT_STORE_PASSWORD") or None


def _open(args: argparse.Namespace) -> RedisStateStore:
    if not args.url:
        raise SystemExit("no store given: pass --url or set KEYSHIFT_STORE_URL")
    return open_store(
        args.url, password=_password(args), ca_file=args.ca_file or None, retry_seconds=10
    )


def _list(args: argparse.Namespace) -> int:
    async def run() -> int:
        store = _open(args)
        try:
            info = await store.job_info(args.job)
            groups = await store.list_key_groups(args.job)
            assignment = await store.get_assignment(args.job)
        finally:
            await store.close()
        if info is None and not groups:
            console.print(f"[red]job {args.job!r} has no state in {args.url}[/red]")
            return 1
        if args.json:
            print(json.dumps({
                "job": args.job,
                "generation": assignment.generation if assignment else 0,
                "key_groups": [asdict(g) for g in groups],
            }, indent=2))  # fmt: skip
            return 0
        table = Table(title=f"{args.job}: generation {assignment.generation if assignment else 0}")
        for column in ("key group", "owner", "epoch", "seq", "position", "watermark", "entries"):
            table.add_column(column, justify="right")
        for g in groups:
            table.add_row(
                str(g.key_group), g.owner or "-", str(g.epoch), str(g.seq), str(g.position),
                "-" if g.watermark is None else str(g.watermark), str(g.entries),
            )  # fmt: skip
        console.print(table)
        return 0

    return asyncio.run(run())


def _transfer(args: argparse.Namespace, verb: str, transfer: Transfer) -> int:
    """Run a savepoint export or import with a progress line."""

    async def run() -> SavepointSummary:
        store = _open(args)
        try:
            with console.status(f"{verb} {args.job}") as status:

                def progress(done: int, total: int) -> None:
                    status.update(f"{verb} {args.job}: {done}/{total} key groups")

                return await transfer(store, args.job, args.file, progress)
        finally:
            await store.close()

    summary = asyncio.run(run())
    console.print(
        f"{verb} {args.job}: {summary.key_groups} key groups, {summary.entries} entries "
        f"({summary.path})"
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    return _transfer(args, "exported", export_job)


def _import(args: argparse.Namespace) -> int:
    return _transfer(args, "imported", import_job)


ALIVE_SECONDS = 10.0
"""A worker whose heartbeat (every 2 s) is this recent counts as running."""


def live_workers(heartbeats: dict[str, float], now: float) -> list[str]:
    """The workers whose last heartbeat is recent enough to count them as running."""
    return sorted(w for w, at in heartbeats.items() if now - at < ALIVE_SECONDS)


async def running_workers(store: StateStore, args: argparse.Namespace, why: str) -> bool:
    """Whether a worker of the job is alive (and ``--force`` not given); if so, say so:
    ``why`` the command must not run under it."""
    alive = live_workers(await store.alive_workers(args.job), time.time())
    if alive and not args.force:
        console.print(
            f"job {args.job!r} is running: {', '.join(alive)} "
            f"{'was' if len(alive) == 1 else 'were'} alive in the last "
            f"{ALIVE_SECONDS:.0f} s{why}. Stop the job first (Ctrl-C its `keyshift run`; "
            "on Kubernetes, delete the StreamJob), or add --force."
        )
        return True
    return False


def _delete(args: argparse.Namespace) -> int:
    if not args.yes:
        console.print(f"deleting all state of {args.job!r} cannot be undone: add --yes")
        return 2

    async def run() -> int:
        store = _open(args)
        try:
            why = (
                ", and a running worker would start the job again from offset 0 on the "
                "deleted state"
            )
            if await running_workers(store, args, why):
                return 2
            removed = await store.delete_job(args.job)
        finally:
            await store.close()
        console.print(f"deleted {removed} keys of job {args.job!r}")
        return 0

    return asyncio.run(run())


def _migrate(args: argparse.Namespace) -> int:
    states: dict[str, Kind] = {name: "map" for name in args.map}
    states |= {name: "list" for name in args.list}
    if not states:
        console.print("name the states to convert: --map STATE and/or --list STATE")
        return 2

    async def run() -> int:
        store = _open(args)
        try:
            why = ", and its workers would be fenced in the middle of their work"
            if await running_workers(store, args, why):
                return 2
            with console.status(f"migrating {args.job}") as status:

                def progress(done: int, total: int) -> None:
                    status.update(f"migrating {args.job}: {done}/{total} key groups")

                summary = await migrate_entries(store, args.job, states, progress)
        except LayoutError as exc:
            console.print(f"[red]{exc}[/red]")
            return 1
        finally:
            await store.close()
        console.print(
            f"migrated {args.job}: {summary.keys} keys in {summary.migrated} of "
            f"{summary.key_groups} key groups to the per-entry layout"
        )
        return 0

    return asyncio.run(run())


# -- self-check ------------------------------------------------------------


async def run_selfcheck(store: StateStore, report: Callable[[str, bool, float], None]) -> bool:
    """Exercise claim, commit, fencing, release, notification and savepoints on ``store``."""
    job = f"selfcheck-{secrets.token_hex(3)}"
    ok = True

    async def check(name: str, body: Callable[[], Awaitable[bool]]) -> None:
        nonlocal ok
        start = time.perf_counter()
        try:
            passed = await body()
        except Exception as exc:  # a self-check reports every failure, whatever it is
            passed = False
            name = f"{name}: {type(exc).__name__}: {exc}"
        ok = ok and passed
        report(name, passed, time.perf_counter() - start)

    async def claim_commit() -> bool:
        await store.init_job(job, 2)
        c = await store.claim(job, 0, "a")
        await store.commit(job, 0, epoch=c.epoch, token=c.token, seq=c.seq,
                           puts={"count": {b"k": b"1"}}, position=1)  # fmt: skip
        return await store.get_many(job, 0, "count", [b"k"]) == {b"k": b"1"}

    async def zombie_fenced() -> bool:
        old = await store.claim(job, 1, "old")
        await store.claim(job, 1, "new")
        try:
            await store.commit(job, 1, epoch=old.epoch, token=old.token, seq=old.seq,
                               puts={"count": {b"k": b"zombie"}}, position=9)  # fmt: skip
        except Fenced:
            return await store.get_many(job, 1, "count", [b"k"]) == {}
        return False

    async def handoff() -> bool:
        c = await store.claim(job, 0, "a")
        await store.release(job, 0, epoch=c.epoch, token=c.token, generation=2)
        nxt = await store.claim(job, 0, "b", generation=2)
        return nxt.position == 1 and (await store.key_group_info(job, 0)).owner == "b"

    async def notification() -> bool:
        await store.publish_assignment(job, Assignment(1, 1, (0, 0)), expected_generation=0)
        watcher = store.watch_assignment(job, poll_interval=30)
        try:
            await asyncio.wait_for(anext(watcher), 5)
            waiting = asyncio.ensure_future(anext(watcher))
            await store.publish_assignment(job, Assignment(2, 2, (0, 1)), expected_generation=1)
            return (await asyncio.wait_for(waiting, 5)).generation == 2
        finally:
            await watcher.aclose()

    async def savepoint() -> bool:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sp"
            await export_job(store, job, path)
            copy = job + "-copy"
            await import_job(store, copy, path)
            same = await store.get_many(copy, 0, "count", [b"k"]) == {b"k": b"1"}
            await store.delete_job(copy)
            return same

    try:
        await check("claim and commit", claim_commit)
        await check("stale writer is fenced, writes nothing", zombie_fenced)
        await check("handoff: release then claim resumes at the position", handoff)
        await check("assignment change is notified", notification)
        await check("savepoint export and import round trip", savepoint)
    finally:
        await store.delete_job(job)
    return ok


def _selfcheck(args: argparse.Namespace) -> int:
    table = Table(title="keyshift state store self-check")
    table.add_column("check")
    table.add_column("result")
    table.add_column("ms", justify="right")

    def report(name: str, passed: bool, seconds: float) -> None:
        table.add_row(name, "[green]ok[/green]" if passed else "[red]FAILED[/red]",
                      f"{seconds * 1000:.1f}")  # fmt: skip

    async def run(url: str, password: str | None, ca_file: str | None = None) -> bool:
        store = open_store(url, password=password, ca_file=ca_file, retry_seconds=10)
        try:
            return await run_selfcheck(store, report)
        finally:
            await store.close()

    if args.url:
        ok = asyncio.run(run(args.url, _password(args), args.ca_file or None))
        where = args.url
    else:
        with tempfile.TemporaryDirectory(prefix="keyshift-selfcheck-") as tmp:
            server = LocalServer(Path(tmp)).start()
            try:
                ok = asyncio.run(run(server.url, None))
            finally:
                server.stop()
            where = f"embedded {Path(server.binary).name} on {server.url}"
    console.print(table)
    console.print(("[green]all checks passed[/green]" if ok else "[red]checks failed[/red]")
                  + f" against {where}")  # fmt: skip
    return 0 if ok else 1
