import json

from django.core.management.base import BaseCommand, CommandError

from ...dashboard.actions import audit_record
from ...dashboard.snapshot import TOKEN_SHOWN
from ...exceptions import LockError
from ...holder import LockInfo
from ...models import AuditEntry
from ...operations import release_held_by

AUDIT_USERNAME = "manage.py release_locks"


class Command(BaseCommand):
    help = (
        "Force-release every lock held by processes of one host (and pid), e.g. from a deploy "
        "script once the old workers are gone: their locks would otherwise stay taken until "
        "their leases end. Reads the held-locks index (no SCAN); each release compares the "
        "token, so a lock that changed hands meanwhile is left alone. Every release is "
        "written to the audit log (AuditEntry); --dry-run only lists."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--host", required=True, help="the holders' host name, as socket.gethostname() gives"
        )
        parser.add_argument("--pid", type=int, help="only the locks of this process id")
        parser.add_argument(
            "--dry-run", action="store_true", help="list what would be released; release nothing"
        )
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")

    def handle(self, *args, host: str, pid: int | None, dry_run: bool, json: bool, **options):
        try:
            displaced = release_held_by(host=host, pid=pid, dry_run=dry_run)
        except LockError as exc:
            raise CommandError(str(exc)) from None
        records = [audit_record(info) for info in displaced]
        if not dry_run:
            held_by = f"host {host}" + ("" if pid is None else f" pid {pid}")
            AuditEntry.objects.bulk_create(
                AuditEntry(
                    user=None,
                    username=AUDIT_USERNAME,
                    action="release_lock",
                    target=info.name[:300],
                    displaced=record,
                    outcome=f"lock {info.name!r} force-released (held by {held_by})"[:300],
                )
                for info, record in zip(displaced, records, strict=True)
            )
        if json:
            self.stdout.write(
                _json({"host": host, "pid": pid, "dry_run": dry_run, "locks": records})
            )
            return
        verb = "would release" if dry_run else "released"
        who = f"host {host!r}" + ("" if pid is None else f", pid {pid}")
        self.stdout.write(f"{verb} {len(displaced)} lock(s) held by {who}")
        for info in displaced:
            self.stdout.write(f"  {_line(info)}")


def _json(data: dict) -> str:
    return json.dumps(data)


def _line(info: LockInfo) -> str:
    since = info.acquired_at.isoformat() if info.acquired_at else "?"
    left = "-" if info.remaining is None else f"{info.remaining:.1f}s"
    token = (info.token or "")[:TOKEN_SHOWN]
    return (
        f"{info.name}  token {token}…  fence {info.fence}  pid {info.pid}  thread {info.thread}  "
        f"caller {info.caller}  held since {since}  lease left {left}"
    )
