from typing import Any

from django.core.management.base import BaseCommand

from jobstate.diagram import mermaid


class Command(BaseCommand):
    help = "Print the job state diagram (mermaid), generated from the model's transitions."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(mermaid())
