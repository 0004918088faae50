package main

import "github.com/sinewmq/sinew/internal/auth"

// The admin API's JSON, as docs/operations.md describes it. The CLI decodes
// only what it shows and ignores fields it does not know, so a newer broker
// that adds fields still works with it; --json prints the answer unchanged.

type apiVersion struct {
	Version string `json:"version"`
	API     string `json:"api"`
}

type apiOverview struct {
	apiVersion
	OwnerID              string           `json:"owner_id"`
	Generation           uint64           `json:"generation"`
	StartedAtMs          int64            `json:"started_at_ms"`
	UptimeMs             int64            `json:"uptime_ms"`
	Ready                bool             `json:"ready"`
	Problems             []string         `json:"problems"`
	Draining             bool             `json:"draining"`
	Queues               int64            `json:"queues"`
	Partitions           int64            `json:"partitions"`
	Totals               map[string]int64 `json:"totals"`
	Counters             map[string]int64 `json:"counters"`
	DeadLetteredByReason map[string]int64 `json:"dead_lettered_by_reason"`
}

type apiQueueConfig struct {
	DeadLetterMode   string `json:"dead_letter_mode"`
	DeadLetterTarget string `json:"dead_letter_target"`
	MaxRetries       int64  `json:"max_retries"`
	DefaultTTLMs     int64  `json:"default_ttl_ms"`
	LeaseMs          int64  `json:"lease_ms"`
}

// apiCounts are the gauges a queue and each of its partitions report.
type apiCounts struct {
	State         string `json:"state"`
	Ready         int64  `json:"ready"`
	Delayed       int64  `json:"delayed"`
	Inflight      int64  `json:"inflight"`
	DeadLettering int64  `json:"dead_lettering"`
	Consumers     int64  `json:"consumers"`
	BytesOnDisk   int64  `json:"bytes_on_disk"`
}

type apiQueue struct {
	Topic           string         `json:"topic"`
	Group           string         `json:"group"`
	PartitionCount  int64          `json:"partition_count"`
	DeadLetterQueue bool           `json:"dead_letter_queue"`
	Config          apiQueueConfig `json:"config"`
	apiCounts
	Partitions []apiPartition `json:"partitions"`
}

type apiPartition struct {
	Partition uint32 `json:"partition"`
	Reason    string `json:"reason"`
	apiCounts
	NextOffset         uint64 `json:"next_offset"`
	SettledFrontier    uint64 `json:"settled_frontier"`
	CheckpointFailures int64  `json:"checkpoint_failures"`
	Relocated          int64  `json:"relocated"`
}

type apiQueues struct {
	Queues []apiQueue `json:"queues"`
}

// apiQueueDeclare is the body of a declare (PUT) or an update (PATCH): only
// the fields set are sent.
type apiQueueDeclare struct {
	Partitions       *int64  `json:"partitions,omitempty"`
	DeadLetterMode   *string `json:"dead_letter_mode,omitempty"`
	DeadLetterTarget *string `json:"dead_letter_target,omitempty"`
	MaxRetries       *int64  `json:"max_retries,omitempty"`
	DefaultTTLMs     *int64  `json:"default_ttl_ms,omitempty"`
	LeaseMs          *int64  `json:"lease_ms,omitempty"`
}

type apiHeader struct {
	Key      string  `json:"key"`
	Value    *string `json:"value"`
	ValueB64 string  `json:"value_b64"`
}

type apiMessage struct {
	Offset        uint64      `json:"offset"`
	State         string      `json:"state"`
	Attempt       uint32      `json:"attempt"`
	PublishedAtMs int64       `json:"published_at_ms"`
	ContentType   string      `json:"content_type"`
	KeyB64        string      `json:"key_b64"`
	Headers       []apiHeader `json:"headers"`
	BodyBytes     int64       `json:"body_bytes"`
	BodyB64       string      `json:"body_b64"`
	BodyTruncated bool        `json:"body_truncated"`
	Error         string      `json:"error"`
}

type apiMessages struct {
	Topic      string       `json:"topic"`
	Group      string       `json:"group"`
	Partition  uint32       `json:"partition"`
	From       uint64       `json:"from"`
	Next       uint64       `json:"next"`
	NextOffset uint64       `json:"next_offset"`
	Messages   []apiMessage `json:"messages"`
}

type apiDeadLetter struct {
	Partition        uint32     `json:"partition"`
	Offset           uint64     `json:"offset"`
	Reason           string     `json:"reason"`
	SourceTopic      string     `json:"source_topic"`
	SourceGroup      string     `json:"source_group"`
	SourcePartition  uint32     `json:"source_partition"`
	SourceOffset     uint64     `json:"source_offset"`
	Retries          int64      `json:"retries"`
	DeadLetteredAtMs int64      `json:"dead_lettered_at_ms"`
	Message          apiMessage `json:"message"`
}

type apiDeadLetters struct {
	Topic       string          `json:"topic"`
	DeadLetters []apiDeadLetter `json:"dead_letters"`
	NextCursor  string          `json:"next_cursor"`
}

type apiReplayItem struct {
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
}

type apiReplayRequest struct {
	Topic string          `json:"topic,omitempty"`
	Items []apiReplayItem `json:"items"`
	Keep  bool            `json:"keep"`
}

type apiReplayResult struct {
	Partition       uint32 `json:"partition"`
	Offset          uint64 `json:"offset"`
	Status          string `json:"status"`
	Error           string `json:"error"`
	TargetTopic     string `json:"target_topic"`
	TargetGroup     string `json:"target_group"`
	TargetPartition uint32 `json:"target_partition"`
	TargetOffset    uint64 `json:"target_offset"`
	Removed         bool   `json:"removed"`
}

type apiReplayResults struct {
	Results []apiReplayResult `json:"results"`
}

type apiSubscription struct {
	SubID     uint64 `json:"sub_id"`
	Topic     string `json:"topic"`
	Group     string `json:"group"`
	Partition *int64 `json:"partition"` // -1: every partition; absent from older brokers
	Prefetch  int64  `json:"prefetch"`
	AutoAck   bool   `json:"auto_ack"`
	Inflight  int64  `json:"inflight"`
}

type apiSession struct {
	ClientID      string            `json:"client_id"`
	State         string            `json:"state"`
	ConnID        uint64            `json:"conn_id"`
	GraceLeftMs   *int64            `json:"grace_left_ms"`
	Inflight      int64             `json:"inflight"`
	Pending       int64             `json:"pending"`
	Subscriptions []apiSubscription `json:"subscriptions"`
}

type apiSessions struct {
	Sessions []apiSession `json:"sessions"`
}

type apiConnection struct {
	ConnID        uint64 `json:"conn_id"`
	RemoteAddr    string `json:"remote_addr"`
	ClientID      string `json:"client_id"`
	ConnectedAtMs int64  `json:"connected_at_ms"`
	Established   bool   `json:"established"`
	Subscriptions int64  `json:"subscriptions"`
}

type apiConnections struct {
	Connections []apiConnection `json:"connections"`
}

type apiRuntimeKey struct {
	Key         string `json:"key"`
	Min         int64  `json:"min"`
	Max         int64  `json:"max"`
	Description string `json:"description"`
}

type apiSettings struct {
	Version     uint64           `json:"version"`
	Values      map[string]int64 `json:"values"`
	RuntimeKeys []apiRuntimeKey  `json:"runtime_keys"`
}

type apiSettingsPut struct {
	Version uint64           `json:"version"`
	Values  map[string]int64 `json:"values"`
}

// apiPermissions are a user's topic patterns per action.
type apiPermissions struct {
	Publish []string `json:"publish"`
	Consume []string `json:"consume"`
	Manage  []string `json:"manage"`
}

func apiPermissionsOf(p auth.Permissions) apiPermissions {
	orEmpty := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	return apiPermissions{Publish: orEmpty(p.Publish), Consume: orEmpty(p.Consume), Manage: orEmpty(p.Manage)}
}

func (p apiPermissions) perms() auth.Permissions {
	return auth.Permissions{Publish: p.Publish, Consume: p.Consume, Manage: p.Manage}
}

type apiUser struct {
	Name        string         `json:"name"`
	Permissions apiPermissions `json:"permissions"`
}

type apiUsersList struct {
	Users []apiUser `json:"users"`
}

// apiUserAdd is the body of POST /api/v1/users; the password travels only
// in a body.
type apiUserAdd struct {
	Name        string         `json:"name"`
	Password    string         `json:"password"`
	Permissions apiPermissions `json:"permissions"`
}

// apiPermissionsPatch is the body of PATCH /api/v1/users/{name}/permissions.
type apiPermissionsPatch struct {
	Grant  apiPermissions `json:"grant"`
	Revoke apiPermissions `json:"revoke"`
}

type apiUserPassword struct {
	Password string `json:"password"`
}
