python -m venv .venv
. .venv/bin/activate
python -m pip install django-jobstate
django-admin startproject mysite
cd mysite
python manage.py startapp reports
