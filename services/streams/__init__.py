"""Work between actors on Redis streams: topology, queues, records, collection, the workers' serving loops."""
