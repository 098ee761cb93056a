"""bkaudit's Spark jobs and command line; extract, transform and load kept apart."""
