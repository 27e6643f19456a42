"""Between-graph TF1 style: replica_device_setter puts variables on the parameter servers."""
import json
import os
import time

import tensorflow as tf

import tfk8s_magics

tf.compat.v1.disable_eager_execution()
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
cluster = tf.train.ClusterSpec(config["cluster"])
server = tf.distribute.Server(cluster, job_name="worker", task_index=index)
STEPS = 20
WORKERS = len(config["cluster"]["worker"])

setter = tf.compat.v1.train.replica_device_setter(worker_device=f"/job:worker/task:{index}", cluster=cluster)
with tf.compat.v1.device(setter):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", shape=[4, 1], initializer=tf.compat.v1.zeros_initializer())
    b = tf.compat.v1.get_variable("b", shape=[1], initializer=tf.compat.v1.zeros_initializer())
    x = tf.random.normal([8, 4])
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
    train = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=global_step)
for v in (global_step, w, b):
    print(f"DEVICE {v.op.name} {v.device}", flush=True)

with tf.compat.v1.Session(server.target) as sess:
    if index == 0:
        sess.run(tf.compat.v1.global_variables_initializer())
    uninitialized = tf.compat.v1.report_uninitialized_variables()
    deadline = time.time() + 120
    while len(sess.run(uninitialized)) and time.time() < deadline:
        time.sleep(0.1)
    for _ in range(STEPS):
        _, step, value = sess.run([train, global_step, loss])
        tfk8s_magics.report_progress(int(step), total=STEPS * WORKERS, loss=float(value))
    deadline = time.time() + 120
    while sess.run(global_step) < STEPS * WORKERS and time.time() < deadline:
        time.sleep(0.05)
    print(f"GLOBAL_STEP {sess.run(global_step)}", flush=True)
