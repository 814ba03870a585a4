"""Model repositories in object storage: Amazon S3 and S3-compatible stores, Google Cloud Storage and
Azure Blob Storage, named by URI as Triton names them (locations.py), with Triton's credentials
(credentials.py), reached through obstore (stores.py), listed and copied to local folders
(remote.py)."""
