from typing import Any

from jobstate.diagram import mermaid
from jobstate.management.commands._common import PipedCommand


class Command(PipedCommand):
    help = "Print the job state diagram (mermaid), generated from the model's transitions."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(mermaid())
