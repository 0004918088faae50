// Package delivery holds the one type that describes a leased message on
// its way from a partition to a client: Delivery. The partition fills in
// what it knows (offset, lease, attempt, the message, the lease's deadline
// and term), the broker adds the queue's names and the partition index, the
// session hands it on, and the server encodes it as a DELIVER frame. Each
// layer uses this type (partition.Delivery, broker.Delivery and
// session.Delivery are aliases of it), so no layer copies it field by
// field into its own.
//
// The package is a leaf: no goroutines, no I/O, no state.
package delivery
