// The consumer flow through the Go client that openapi-generator's `go` generator makes from openapi.yaml
// (unmodified; tests/integration/test_generated_clients.py builds this file as a command of the generated module):
// produce (binary and json records) -> for a binary and a json instance: create -> subscribe -> poll -> commit -> committed offsets
// (query parameters, none) -> delete. Prints one JSON object with what it saw; exits non-zero on any error.
// Usage: flow <gateway URL> <API key> <topic> <group prefix> <records>
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	kcg "github.com/kcg/client"
)

func check(err error, what string) {
	if err == nil {
		return
	}
	detail := ""
	if apiErr, ok := err.(*kcg.GenericOpenAPIError); ok {
		detail = string(apiErr.Body())
	}
	fmt.Fprintf(os.Stderr, "%s failed: %v %s\n", what, err, detail)
	os.Exit(1)
}

func b64(text string) string { return base64.StdEncoding.EncodeToString([]byte(text)) }

func unb64(v interface{}) interface{} {
	raw, err := base64.StdEncoding.DecodeString(v.(string))
	check(err, "base64")
	var out interface{}
	check(json.Unmarshal(raw, &out), "json")
	return out
}

func main() {
	base, apiKey, topic, prefix := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	n, err := strconv.Atoi(os.Args[5])
	check(err, "records")
	cfg := kcg.NewConfiguration()
	cfg.Servers = kcg.ServerConfigurations{{URL: base}}
	client := kcg.NewAPIClient(cfg)
	ctx := context.WithValue(context.Background(), kcg.ContextAccessToken, apiKey)

	// the first half as binary records (base64, the format named by ContentType), the rest as json records (the
	// body's default media type): one body type, JsonProduceRequest, carries both
	half := n / 2
	binary, asJSON := []kcg.JsonProduceRecord{}, []kcg.JsonProduceRecord{}
	for i := 0; i < n; i++ {
		record := kcg.NewJsonProduceRecord()
		if i < half {
			record.SetKey(b64(fmt.Sprintf("%q", fmt.Sprintf("k%d", i))))
			record.SetValue(b64(fmt.Sprintf(`{"n": %d}`, i)))
			binary = append(binary, *record)
		} else {
			record.SetKey(fmt.Sprintf("k%d", i))
			record.SetValue(map[string]int{"n": i})
			asJSON = append(asJSON, *record)
		}
	}
	produced := []int64{}
	for _, request := range []kcg.ApiProduceToTopicRequest{
		client.ProduceAPI.ProduceToTopic(ctx, topic).JsonProduceRequest(*kcg.NewJsonProduceRequest(binary)).
			ContentType("application/vnd.kafka.binary.v2+json"),
		client.ProduceAPI.ProduceToTopic(ctx, topic).JsonProduceRequest(*kcg.NewJsonProduceRequest(asJSON)),
	} {
		answer, _, err := request.Execute()
		check(err, "produce")
		for _, o := range answer.Offsets {
			if o.ErrorCode.Get() != nil {
				check(fmt.Errorf("%s", *o.Error.Get()), "produce record")
			}
			produced = append(produced, *o.Offset.Get())
		}
	}
	out := map[string]interface{}{"produced": produced}
	for _, format := range []string{"binary", "json"} {
		group := prefix + "-" + format
		create := kcg.NewCreateConsumer()
		create.SetName("go-" + format)
		create.SetFormat(format)
		create.SetAutoOffsetReset("earliest")
		off := "false"
		create.SetAutoCommitEnable(kcg.AutoCommitEnable{String: &off})
		created, _, err := client.ConsumersAPI.CreateConsumer(ctx, group).CreateConsumer(*create).Execute()
		check(err, "create")
		iid := created.InstanceId
		sub := kcg.NewSubscription()
		sub.SetTopics([]string{topic})
		_, err = client.ConsumersAPI.Subscribe(ctx, group, iid).Subscription(*sub).Execute()
		check(err, "subscribe")
		subscription, _, err := client.ConsumersAPI.GetSubscription(ctx, group, iid).Execute()
		check(err, "subscription")
		got := []kcg.ConsumerRecord{}
		deadline := time.Now().Add(60 * time.Second)
		for len(got) < n && time.Now().Before(deadline) {
			batch, _, err := client.ConsumersAPI.GetRecords(ctx, group, iid).Timeout(1000).Execute()
			check(err, "poll")
			got = append(got, batch...)
		}
		values, keys := []interface{}{}, []interface{}{}
		last := map[int32]int64{}
		for _, r := range got {
			if format == "binary" {
				values, keys = append(values, unb64(r.Value)), append(keys, unb64(r.Key))
			} else {
				values, keys = append(values, r.Value), append(keys, r.Key)
			}
			if prev, ok := last[r.Partition]; !ok || r.Offset > prev {
				last[r.Partition] = r.Offset
			}
		}
		parts := []int32{}
		for p := range last {
			parts = append(parts, p)
		}
		sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
		commit := client.ConsumersAPI.CommitOffsets(ctx, group, iid)
		if format == "binary" { // name the last offset of each partition; the json instance commits all it got
			offsets := []kcg.CommitOffset{}
			for _, p := range parts {
				offsets = append(offsets, *kcg.NewCommitOffset(topic, p, last[p]))
			}
			commits := kcg.NewCommitOffsets()
			commits.SetOffsets(offsets)
			commit = commit.CommitOffsets(*commits)
		}
		commitAnswer, _, err := commit.Execute()
		check(err, "commit")
		topics := []string{}
		for range parts {
			topics = append(topics, topic)
		}
		byQuery, _, err := client.ConsumersAPI.GetCommittedOffsets(ctx, group, iid).Topic(topics).Partition(parts).Execute()
		check(err, "committed (query)")
		assigned, _, err := client.ConsumersAPI.GetCommittedOffsets(ctx, group, iid).Execute()
		check(err, "committed (assigned)")
		_, err = client.ConsumersAPI.DeleteConsumer(ctx, group, iid).Execute()
		check(err, "delete")
		committed := func(list []kcg.CommittedOffset) map[string]int64 {
			m := map[string]int64{}
			for _, o := range list {
				m[strconv.Itoa(int(o.Partition))] = o.Offset
			}
			return m
		}
		lastOut := map[string]int64{}
		for p, o := range last {
			lastOut[strconv.Itoa(int(p))] = o
		}
		out[format] = map[string]interface{}{
			"instanceId": iid, "subscription": subscription.Topics, "values": values, "keys": keys,
			"last": lastOut, "commitAnswer": commitAnswer,
			"committedByQuery": committed(byQuery.Offsets), "committedAssigned": committed(assigned.Offsets),
		}
	}
	text, err := json.Marshal(out)
	check(err, "output")
	fmt.Println(string(text))
}
