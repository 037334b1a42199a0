"""Enqueue example tasks so a worker has something to do; ``--trickle`` keeps it going."""

import argparse
import signal
import threading
from datetime import timedelta

from django.core.management.base import BaseCommand
from django.utils import timezone

from django_tasks_plus.schedules import Every, ScheduleNotFound, api
from django_tasks_plus.schedules.timing import as_spec
from django_tasks_plus.schedules.words import describe
from example.tasks import (
    add,
    deliver_webhook,
    flaky,
    import_feed,
    scheduled_report,
    send_receipt,
    slow,
    sync_account,
)

HOSTS = ("up.example.net", "sometimes.example.net", "down.example.net")
# (name, when, what the task reports) of the demo's schedules.
SCHEDULES = (
    ("demo-heartbeat", Every(seconds=30), "heartbeat"),
    ("demo-digest", "*/5 * * * *", "digest"),
)


class Command(BaseCommand):
    help = (
        "Enqueue demo tasks: some `add`, some `flaky` (fail twice, then succeed), some `slow`, "
        "and store two schedules (every 30 s, every 5 minutes) if missing. "
        "With --trickle, keep enqueueing a mix (retries, dead letters, a circuit breaker, a "
        "blocked ordering key, scheduled tasks) until stopped; the "
        "first round has one of each, so every state shows within a minute."
    )

    def add_arguments(self, parser):
        parser.add_argument("--add", type=int, default=10, help="number of add tasks (10)")
        parser.add_argument("--flaky", type=int, default=3, help="number of flaky tasks (3)")
        parser.add_argument("--slow", type=int, default=2, help="number of slow tasks (2)")
        parser.add_argument(
            "--fail-times", type=int, default=2, help="failures before a flaky task succeeds (2)"
        )
        parser.add_argument(
            "--seconds", type=float, default=1.0, help="how long a slow task sleeps (1.0)"
        )
        parser.add_argument(
            "--schedules",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="store the demo's two schedules if they are missing (default: yes)",
        )
        parser.add_argument(
            "--trickle",
            type=float,
            metavar="SECONDS",
            help="after the batch, enqueue a few tasks every SECONDS until SIGTERM/Ctrl-C",
        )

    def handle(self, *args, **options):
        enqueued = []
        for i in range(options["add"]):
            enqueued.append((f"add({i}, {i * 10})", add.enqueue(i, i * 10)))
        for _ in range(options["flaky"]):
            fail_times = options["fail_times"]
            enqueued.append((f"flaky(fail_times={fail_times})", flaky.enqueue(fail_times)))
        for _ in range(options["slow"]):
            seconds = options["seconds"]
            enqueued.append((f"slow({seconds})", slow.enqueue(seconds)))

        for call, result in enqueued:
            self.stdout.write(
                f"enqueued {call:<28} queue={result.task.queue_name:<8} id={result.id}"
            )
        self.stdout.write(self.style.SUCCESS(f"Enqueued {len(enqueued)} tasks."))
        if options["schedules"]:
            self._schedules()
        if options["trickle"]:
            self._trickle(max(0.1, options["trickle"]))

    def _schedules(self) -> None:
        """Two runtime schedules, so the schedules page shows some from the start."""
        for name, when, what in SCHEDULES:
            try:
                api.get(name)
                continue
            except ScheduleNotFound:
                pass
            api.create(name, scheduled_report, when, kwargs={"what": what}, overlap="skip")
            self.stdout.write(f"stored schedule {name} ({describe(as_spec(when, name))})")

    def _trickle(self, every: float) -> None:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        self.stdout.write(f"Enqueueing a few demo tasks every {every:g} s until stopped.")
        self.stdout.flush()
        for step in range(1, 6):  # acme's step 3 dies and blocks steps 4 and 5
            sync_account.using(ordering_key="account:acme").enqueue("acme", step)
        total, tick = 5, 0
        while not stop.wait(every):
            tick += 1
            total += self._tick(tick)
        self.stdout.write(f"Stopped the demo trickle after enqueueing {total} tasks.")

    def _tick(self, tick: int) -> int:
        """One round of the trickle; how many tasks it enqueued. The first round (tick 1)
        enqueues one of each kind, so every state appears within a minute."""
        count = 0
        for n in range(3):
            add.enqueue(tick, n)
            count += 1
        send_receipt.enqueue(tick)
        deliver_webhook.enqueue(f"https://{HOSTS[tick % 3]}/hooks", f"order.paid #{tick}")
        count += 2
        if tick % 5 == 0:
            flaky.enqueue(2)
            slow.enqueue(3.0)
            count += 2
        if tick % 10 == 1:
            later = timezone.now() + timedelta(minutes=2)
            add.using(run_after=later).enqueue(tick, 0)  # shows as scheduled
            for step in range(1, 4):
                account = f"globex-{tick}"
                sync_account.using(ordering_key=f"account:{account}").enqueue(account, step)
            count += 4
        if tick % 15 == 1:
            import_feed.enqueue(f"https://feeds.example.org/{tick}.xml")
            count += 1
        return count
