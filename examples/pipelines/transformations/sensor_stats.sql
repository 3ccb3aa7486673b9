-- The materialized view over the streaming table: one row per sensor, recomputed on each run.
CREATE MATERIALIZED VIEW sensor_stats AS
SELECT sensor,
       count(*)              AS readings,
       round(avg(value), 3)  AS avg_value,
       max(value)            AS max_value,
       max(eventTime)        AS last_reading
FROM readings
GROUP BY sensor
