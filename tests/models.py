"""Test-only tables (the ``tests`` app has no migrations: pytest-django creates them)."""

from __future__ import annotations

from django.db import models


class Effect(models.Model):
    """A side effect of a test workflow, written by worker processes too, so tests
    can count how often each step (or item) really ran, crashes included."""

    job_id = models.UUIDField(db_index=True)
    label = models.CharField(max_length=100)
    item = models.IntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    pid = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.label} {self.item if self.item is not None else ''}".strip()


class Ledger(models.Model):
    """Rows with ties, NULLs and many column types, read in chunks by keyset (test_workflow_keyset)."""

    name = models.CharField(max_length=20)
    rank = models.IntegerField(null=True)
    amount = models.DecimalField(max_digits=8, decimal_places=2)
    day = models.DateField()
    at = models.DateTimeField(null=True)
    code = models.UUIDField()
    blob = models.BinaryField(default=b"")

    def __str__(self) -> str:
        return f"{self.name} {self.rank}"
