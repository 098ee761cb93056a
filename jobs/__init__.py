"""bkaudit's Spark jobs and command line. Extract, transform and load are kept in separate modules."""
