"""Executing offload schedules: host memory copies, op by op and compiled."""
