from jobstate.models.asset import Asset
from jobstate.models.event import JobEvent
from jobstate.models.job import Job
from jobstate.models.step import JobStep

__all__ = ["Asset", "Job", "JobEvent", "JobStep"]
