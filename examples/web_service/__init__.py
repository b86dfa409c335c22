"""A FastAPI service answering a session's recommendations from a served ensemble (app.py)."""
