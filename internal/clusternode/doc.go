// Package clusternode is a node's part in a Sinew cluster
// (cluster.enabled): its stable node id, gossip membership
// (internal/membership), the raft transport to its peers (internal/raftnet),
// the raft host that drives every group on the node (internal/multiraft),
// and its replica of the controller group (internal/controller), which holds
// the committed node table, the queue catalogue and the runtime settings.
//
// `sinew serve` starts a Node with Start before it opens the broker, then
// wires the two together: the Node is the broker's broker.Cluster (queue
// creation, lookup, deletion and purges go through the controller's
// catalogue), SyncCatalogue keeps the broker's partitions in step with the
// catalogue, ReportLoad publishes the node's load in gossip, Admin adds the
// cluster's views and operations (nodes, leave, partition moves, metrics) to
// the admin API, and HandOverForStop hands the leads the node holds over to
// caught-up replicas before a planned stop drains.
//
// A Node runs in any process: tests start several in one
// (TestThreeNodesFormInProcess) on loopback ports the system picks.
package clusternode
