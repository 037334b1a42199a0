"""Enqueue a handful of example tasks so a worker has something to do."""

from django.core.management.base import BaseCommand

from example.tasks import add, flaky, slow


class Command(BaseCommand):
    help = "Enqueue demo tasks: some `add`, some `flaky` (fail twice, then succeed), some `slow`."

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
