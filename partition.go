package sluice

// Partitioner is implemented by stores whose keys live on partitions that
// fail apart: a Redis Cluster's masters (redisstore.Store). A failure-policy
// wrapper (package resilient) keeps a circuit breaker per partition, so
// that one partition down sends only its own keys to the failure policy.
type Partitioner interface {
	// Partition names the partition key's state lives on now: the same
	// name for every key on one partition, "" when the store cannot tell
	// (all keys are then treated as one partition). It answers from
	// memory, without a call, and is safe for concurrent use.
	Partition(key string) string
}

// KeyFailure is implemented by an error of a call on several keys (a
// TakeAll whose keys span partitions) that failed on one key's partition:
// FailedKey names that key, so that a per-partition breaker charges that
// partition alone, not the ones whose keys were answered. Find it with
// errors.As.
type KeyFailure interface {
	error
	FailedKey() string
}
