"""Experiments on a scenario: policies compared, a policy's tiers changed, a paper reproduced.

Each module computes and returns dataclasses; :mod:`kvtier.report` renders them (terminal
tables, JSON, markdown, HTML) and computes nothing.
"""
