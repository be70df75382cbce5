"""A local ZooKeeper for the job coordinator: :mod:`dev.zookeeper.zookeeper`."""
