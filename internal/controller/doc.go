// Package controller is the cluster's controller: a raft group over the
// nodes whose committed log is the cluster's Table: the node table, the
// queue catalogue (each queue's declaration and its partitions' raft groups
// and replicas, catalogue.go), and the cluster's runtime settings. Every
// change to the table is
// a committed raft entry before any node applies it, and every node applies
// the same entries in the same order, so each holds the same table at the
// same index.
//
// # Membership of the group
//
// One node bootstraps the group (Config.Bootstrap, on a data directory
// without a controller log) as its only voter. The leader then reconciles
// the table and the group with the membership view it is handed
// (Controller.Reconcile): a live node it does not hold, or holds at other
// client, peer or gossip addresses, gets a join entry (a view that does
// not know a node's gossip address leaves the recorded one); a node that
// left on purpose gets a leave entry; and one configuration change
// at a time makes the first VotersMax nodes in join order voters and every
// other member a learner, so every node receives the table. A voter the
// view reports dead is demoted to learner when a live member can take its
// seat, which is then promoted; with none, it keeps its seat.
//
// # Storage and restart
//
// The log is a seglog (internal/raftlog) in Config.Dir/log. Entries and
// the HardState are fsynced before the messages of the same Ready leave.
// Every Config.SnapshotEvery applied entries the controller writes a
// snapshot (Config.Dir/snapshot: a CRC-32C, then JSON of the table, the
// group's configuration, index and term), stores that configuration with
// the log, and lets the log drop the segments the snapshot covers. The
// file is written first; Open repairs the stored configuration from it
// after a crash in between. A restart starts from the snapshot (or from an
// empty table and configuration) and replays the committed entries after
// it, configuration changes included, so the node holds the committed
// table before it hears from any peer. A follower the log no longer serves
// is sent a snapshot of the state as applied at that moment.
//
// # Entries
//
// A table entry's data is the record type byte 1 followed by a JSON
// command with a version ("v": 1) and an op (table.go): "join" with the
// node, "leave" with its raft id; "create_queue", "update_queue",
// "delete_queue", "purge_queue", "purge_done", "placement_done",
// "replace_replica" and "add_replica" for the catalogue; "start_move",
// "cancel_move" and "unpin_queue" for operator moves (moves.go); "set_runtime" for the runtime
// settings; "cohort_report" and "cohort_plan" for the cohorts (consumer
// groups, cohorts.go): the members a node serves, and each cohort's
// assignment plan, fenced by its generation. A replica refuses an entry it cannot apply, rather than skip
// it, and then stops (Status.Err).
//
// Raft ids are derived from node ids (RaftIDOf): the first 64 bits of the
// 128-bit id.
package controller
