"""The tools that compose the roles: the run's one plan (plan.py), the doctor, status and rollback.
They stand above every role; no role and nothing of sparkfleet/ (the ground floor) imports them."""
