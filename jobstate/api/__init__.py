"""jobstate's REST API (Django REST framework): include ``jobstate.api.urls``."""
