"""The frontend's model instances: each instance's worker process (started, watched, restarted,
stopped), its batches and its model's own calls, the worker templates that fork the processes, and
the pool of a version's instances that its scheduler feeds."""
