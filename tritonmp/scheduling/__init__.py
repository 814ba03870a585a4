"""Scheduling: queues, dynamic and sequence batching, ensembles, the response cache."""
