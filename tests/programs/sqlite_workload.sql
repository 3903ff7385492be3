-- A scripted sqlite3 workload for the LD_PRELOAD tests (heavy allocation: sorting, indexes, strings).
CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, payload BLOB);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000)
INSERT INTO t SELECT x, x % 97, printf('name-%d-%s', x, substr('abcdefghijklmnopqrstuvwxyz', 1 + x % 26)), zeroblob(x % 300) FROM c;
CREATE INDEX t_grp ON t(grp, name);
SELECT grp, count(*), sum(length(payload)), max(name) FROM t GROUP BY grp ORDER BY grp LIMIT 10;
SELECT count(DISTINCT name), sum(id) FROM t WHERE name LIKE '%-1%';
SELECT group_concat(name, ',') IS NOT NULL, length(group_concat(name, ',')) FROM (SELECT name FROM t ORDER BY name DESC LIMIT 5000);
UPDATE t SET name = name || '-updated' WHERE id % 3 = 0;
DELETE FROM t WHERE id % 5 = 0;
SELECT count(*), sum(length(name)) FROM t;
