// Package rabbit adapts RabbitMQ to the benchkit workload engine with the settings
// that make it a durable work queue comparable to Sinew: a quorum queue (whose
// log is fsynced before a publish is confirmed), persistent messages, publisher
// confirms, and consumers with manual acknowledgement and a prefetch (basic.qos).
//
// Goroutines: amqp091-go runs a reader per connection; each Consume starts one
// goroutine that ranges over its deliveries and ends when Stop cancels the
// consumer. Publishes from many goroutines share one confirm-mode channel per
// connection, which the client serialises.
package rabbit
