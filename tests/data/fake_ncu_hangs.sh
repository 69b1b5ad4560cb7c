#!/bin/sh
# A stand-in for ncu whose worker never finishes (tests/tasks/test_profile.py): it sleeps past any
# profile_timeout_s the test gives.
sleep 60
