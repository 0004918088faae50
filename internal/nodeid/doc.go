// Package nodeid gives a node a stable identity kept in its data directory.
//
// The id is created once, from crypto/rand, the first time a data directory
// is opened, and read back on every later start. It belongs to the data,
// not to the machine: a data directory moved to another host keeps its id,
// so the cluster sees the same node (with the same replicas) at a new
// address. A damaged id file is an error, never replaced by a new id: a new
// id would make the node a stranger that still holds another node's data.
//
// The file is one line of text, checksummed:
//
//	sinew-node-id 1 <id: 32 lowercase hex digits> <CRC-32C of the id, 8 hex digits>\n
//
// It is written with vfs.WriteFileAtomic (temporary file, fsync, rename,
// fsync of the directory), so after a crash it is either absent or whole.
// Nothing here starts a goroutine.
package nodeid
