"""The book's measured results (JSON with their provenance, and plots), installed as the package data of
``loglin_edu.results`` so that an installed ``loglin_edu`` finds them without a checkout of the repository.
Read them with :func:`loglin_edu.viz.results.load`."""
