from jobstate.models.asset import Asset
from jobstate.models.event import JobEvent
from jobstate.models.job import Job
from jobstate.models.pause import KindPause
from jobstate.models.spawn import JobStepSpawn
from jobstate.models.step import JobStep
from jobstate.models.worker import WorkerProcess

__all__ = ["Asset", "Job", "JobEvent", "JobStep", "JobStepSpawn", "KindPause", "WorkerProcess"]
