package main

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

func readyz(t *testing.T, b *broker.Broker) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	// /readyz reads only the broker; the server is not needed.
	admin.Handler(adminConfig(b, nil, nil, adminWiring{owner: "b-test", queueDepth: true})).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

// /readyz on the real broker: ready while every partition serves, not ready
// (naming the partition and why) once one has failed.
func TestReadyzReportsFailedPartition(t *testing.T) {
	fs := vfs.NewMem()
	b, err := broker.Open(broker.Config{DataDir: "/data", FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	publish := func(topic string) error {
		ch := make(chan error, 1)
		b.Publish(&protocol.Publish{Topic: topic, Partition: -1, Body: []byte("x")},
			func(_ protocol.PublishOK, err error) { ch <- err })
		return <-ch
	}
	if err := publish("healthy"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "doomed", MaxRetries: -1}); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(t, b); code != 200 || body != "ready\n" {
		t.Fatalf("healthy broker: %d %q", code, body)
	}
	fs.SetSyncError(errors.New("input/output error"))
	err = publish("doomed")
	fs.SetSyncError(nil)
	if protocol.CodeOf(err) != protocol.CodeUnavailable {
		t.Fatalf("publish with a failing fsync: %v", err)
	}
	code, body := readyz(t, b)
	if code != 503 || !strings.Contains(body, `queue "doomed" group "" partition 0 failed`) ||
		!strings.Contains(body, "input/output error") || strings.Contains(body, "healthy") {
		t.Fatalf("broker with a failed partition: %d %q", code, body)
	}
}
