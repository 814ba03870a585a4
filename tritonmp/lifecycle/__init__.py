"""Model versions through their life: loaded from the repository, served, reloaded, unloaded; and the
model manager that keeps them and finds the one a request is for."""
