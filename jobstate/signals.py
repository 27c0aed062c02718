"""Signals for integrators. jobstate itself never listens to them.

``job_transitioned`` is sent after the transaction that changed the job has
committed, with ``job_id``, ``from_status``, ``to_status``, ``transition``,
``actor_label`` and ``reason``.
"""

from django.dispatch import Signal

job_transitioned = Signal()
